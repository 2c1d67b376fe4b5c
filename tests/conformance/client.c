/*
 * loom-mcp-conformance: the client program the official MCP conformance
 * suite (@modelcontextprotocol/conformance, tests/conformance/run.sh)
 * runs against its scenario servers, built on libloom's MCP client
 * (loom/mcp.h) and nothing else.
 *
 *   loom-mcp-conformance SERVER_URL
 *
 * The runner sets MCP_CONFORMANCE_SCENARIO (what to do),
 * MCP_CONFORMANCE_PROTOCOL_VERSION (the era: the server config's
 * protocol_version) and, for some scenarios, MCP_CONFORMANCE_CONTEXT (a
 * JSON object: the tool calls to make). By default the client lists the
 * server's tools and calls each one with arguments made from its schema;
 * a few scenarios ask for more (resources and prompts) or less (no call).
 * Elicitations are accepted with an empty content, so the schema's
 * defaults (which libloom fills in) are what the server gets.
 *
 * OAuth (the auth/ scenarios): the client is public and names itself by
 * a Client ID Metadata Document URL where the server takes those; the
 * pre-registered client of MCP_CONFORMANCE_CONTEXT (client_id,
 * client_secret, private_key_pem) when there is one; the
 * client-credentials grant for the auth/client-credentials-* scenarios.
 * The scenario's authorization server answers an authorization request
 * at once with a redirect, so the "person" here fetches the URL and
 * hands back where it was sent. Exits 1 when a step failed.
 */
#include "loom/log.h"
#include "loom/mcp.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int failures;

static void step(const char *what, int rc, json_t *result)
{
    char *text = result ? json_dumps(result, JSON_COMPACT) : NULL;

    if (rc != 0) {
        fprintf(stderr, "%s: failed: %s\n", what, loom_error_last());
        failures++;
    } else {
        printf("%s: %.300s\n", what, text ? text : "ok");
    }
    free(text);
    json_decref(result);
}

/* Accepts every elicitation with an empty content (or what the
 * confirm-style schemas of the MRTR scenario ask). */
static int on_input(loom_mcp_server *s, const char *method,
                    const json_t *params, void *arg, json_t **result)
{
    (void)s;
    (void)arg;
    (void)params;
    printf("input: %s\n", method);
    *result = json_pack("{s:s,s:{}}", "action", "accept", "content");
    return *result ? 0 : LOOM_ENOMEM;
}

/* The suite's CIMD URL: its authorization servers take it as is. */
#define CIMD_URL "https://conformance-test.local/client-metadata.json"

static int redirect_uri(void *arg, char *uri, size_t cap)
{
    (void)arg;
    snprintf(uri, cap, "http://localhost:3000/callback");
    return 0;
}

static size_t keep_location(char *data, size_t size, size_t n, void *arg)
{
    char **loc = arg;
    size_t len = size * n, k;

    if (len > 9 && !strncasecmp(data, "location:", 9) && !*loc) {
        data += 9;
        len -= 9;
        while (len && *data == ' ')
            data++, len--;
        for (k = len; k && (data[k - 1] == '\r' || data[k - 1] == '\n'); k--)
            ;
        *loc = strndup(data, k);
    }
    return size * n;
}

static size_t drop(char *data, size_t size, size_t n, void *arg)
{
    (void)data;
    (void)arg;
    return size * n;
}

/* The "browser": GET url, and where the server redirects is the
 * callback. */
static int authorize(void *arg, const char *url, char **callback)
{
    CURL *e = curl_easy_init();
    CURLcode cc;

    (void)arg;
    *callback = NULL;
    if (!e)
        return LOOM_ENOMEM;
    printf("authorize: %.200s\n", url);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, keep_location);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, callback);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, drop);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    cc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    if (cc != CURLE_OK || !*callback) {
        fprintf(stderr, "authorize: no redirect (%s)\n",
                curl_easy_strerror(cc));
        return LOOM_EUPSTREAM;
    }
    return 0;
}

/* Arguments for tool made from its schema's required properties. */
static json_t *args_for(const json_t *tool)
{
    const json_t *schema = json_object_get(tool, "inputSchema");
    const json_t *props = json_object_get(schema, "properties");
    const json_t *req = json_object_get(schema, "required"), *r;
    json_t *args = json_object();
    size_t i;
    int n = 2;

    json_array_foreach(req, i, r)
    {
        const char *key = json_string_value(r);
        const char *type = json_string_value(
            json_object_get(json_object_get(props, key ? key : ""), "type"));
        json_t *v;
        if (!key)
            continue;
        if (type && (!strcmp(type, "number") || !strcmp(type, "integer")))
            v = json_integer(n++);
        else if (type && !strcmp(type, "boolean"))
            v = json_true();
        else
            v = json_string("x");
        json_object_set_new(args, key, v);
    }
    return args;
}

static void call_tool(loom_mcp_server *s, const char *name, json_t *args)
{
    json_t *out = NULL;
    char what[160];
    int rc;

    snprintf(what, sizeof(what), "tools/call %s", name);
    /* Its own statement: an argument of step() may be read before
     * another one's call sets it. */
    rc = loom_mcp_server_call(s, name, args, 0, NULL, &out);
    step(what, rc, out);
    json_decref(args);
}

static void request(loom_mcp_server *s, const char *method, json_t *params,
                    json_t **keep)
{
    json_t *out = NULL;
    int rc = loom_mcp_server_request(s, method, params, 0, NULL, &out);

    json_decref(params);
    if (keep && rc == 0)
        *keep = json_incref(out);
    step(method, rc, out);
}

/* http-standard-headers: resources and prompts too. */
static void resources_and_prompts(loom_mcp_server *s)
{
    json_t *list = NULL;
    const json_t *first;

    request(s, "resources/list", NULL, &list);
    first = json_array_get(json_object_get(list, "resources"), 0);
    if (first)
        request(s, "resources/read",
                json_pack("{s:O}", "uri", json_object_get(first, "uri")), NULL);
    json_decref(list);
    list = NULL;
    request(s, "prompts/list", NULL, &list);
    first = json_array_get(json_object_get(list, "prompts"), 0);
    if (first)
        request(s, "prompts/get",
                json_pack("{s:O}", "name", json_object_get(first, "name")),
                NULL);
    json_decref(list);
}

int main(int argc, char **argv)
{
    const char *scenario = getenv("MCP_CONFORMANCE_SCENARIO");
    const char *version = getenv("MCP_CONFORMANCE_PROTOCOL_VERSION");
    const char *context = getenv("MCP_CONFORMANCE_CONTEXT");
    loom_mcp_server_config cfg = {0};
    loom_mcp_authorizer az = {redirect_uri, authorize, NULL};
    loom_mcp_server *s = NULL;
    json_t *tools = NULL, *ctx = NULL, *calls;
    const json_t *t;
    size_t i;
    int rc;

    if (argc != 2) {
        fprintf(stderr, "usage: loom-mcp-conformance SERVER_URL\n");
        return 2;
    }
    if (!scenario)
        scenario = "";
    loom_log_set(stderr, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    cfg.name = "conformance";
    cfg.url = argv[1];
    cfg.protocol_version = version && *version ? (char *)version : NULL;
    cfg.timeout_ms = 20000;
    cfg.startup_timeout_ms = 20000;
    ctx = context ? json_loads(context, 0, NULL) : NULL;
    cfg.oauth.client_metadata_url = CIMD_URL;
    cfg.oauth.client_id =
        (char *)json_string_value(json_object_get(ctx, "client_id"));
    cfg.oauth.client_secret =
        (char *)json_string_value(json_object_get(ctx, "client_secret"));
    cfg.oauth.private_key =
        (char *)json_string_value(json_object_get(ctx, "private_key_pem"));
    cfg.oauth.signing_alg =
        (char *)json_string_value(json_object_get(ctx, "signing_algorithm"));
    if (!strncmp(scenario, "auth/client-credentials", 23))
        cfg.oauth.grant_type = "client_credentials";
    if (loom_mcp_server_new(&s, &cfg) != 0) {
        fprintf(stderr, "%s\n", loom_error_last());
        return 1;
    }
    loom_mcp_server_set_input(s, on_input, NULL);
    loom_mcp_server_set_authorizer(s, &az);

    rc = loom_mcp_server_tools(s, &tools);
    step("tools/list", rc, tools ? json_incref(tools) : NULL);
    calls = json_object_get(ctx, "toolCalls");
    if (rc != 0 || !strcmp(scenario, "json-schema-ref-no-deref")) {
        /* listing is the whole scenario */
    } else if (!strcmp(scenario, "json-schema-2020-12-preservation")) {
        json_array_foreach(tools, i, t)
        {
            if (!strcmp(json_string_value(json_object_get(t, "name")),
                        "json_schema_2020_12_tool"))
                call_tool(s, "json_schema_echo",
                          json_pack("{s:O}", "schema",
                                    json_object_get(t, "inputSchema")));
        }
    } else if (json_is_array(calls)) {
        json_array_foreach(calls, i, t)
        {
            call_tool(s, json_string_value(json_object_get(t, "name")),
                      json_deep_copy(json_object_get(t, "arguments")));
        }
    } else {
        json_array_foreach(tools, i, t)
        {
            call_tool(s, json_string_value(json_object_get(t, "name")),
                      args_for(t));
        }
    }
    if (!strcmp(scenario, "http-standard-headers"))
        resources_and_prompts(s);
    json_decref(ctx);
    json_decref(tools);
    loom_mcp_server_free(s);
    return failures ? 1 : 0;
}
