/*
 * HTTP tools declared in config (`http_tools:`) end to end: a YAML file
 * declares tools pointing at a local server (libmicrohttpd on 127.0.0.1,
 * allowlisted on purpose), loom_tools_add_from_config registers them, the
 * config is freed, and each call is checked on the server's side: the
 * method, the JSON body (POST, PUT, PATCH) or the query string (GET,
 * DELETE), the headers with a secret from ${ENV}. The results carry the
 * status and the body; 4xx is a failed call, a redirect is returned and
 * not followed, and the limits (bytes, time, max_chars, URL length) are
 * crossed. A tool whose host is not allowlisted is refused before any
 * connection. Config errors name the file, line and key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "loom/config.h"
#include "loom/tools.h"
#include "tools/netguard.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct MHD_Daemon *daemon_;
static int port;

/* What the server saw of the last request. */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int count;
    char method[16];
    char path[256];
    json_t *args; /* [[key, value], ...] in order */
    char auth[128], custom[64], type[128], agent[128], accept[128];
    char body[65536];
    size_t body_len;
} seen;

/* ---- the server */

typedef struct {
    char body[65536];
    size_t len;
} upload;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind,
                                   const char *key, const char *value)
{
    (void)kind;
    json_array_append_new(cls, json_pack("[s,s]", key, value ? value : ""));
    return MHD_YES;
}

static void copy_header(struct MHD_Connection *c, const char *name, char *dst,
                        size_t cap)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);

    snprintf(dst, cap, "%s", v ? v : "");
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const char *type, const char *body, size_t len,
                             const char *location)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (type)
        MHD_add_response_header(r, "Content-Type", type);
    if (location)
        MHD_add_response_header(r, "Location", location);
    ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static ssize_t slow_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)cls;
    (void)max;
    if (pos >= 50)
        return MHD_CONTENT_READER_END_OF_STREAM;
    usleep(200 * 1000);
    buf[0] = 's';
    return 1;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode code)
{
    (void)cls;
    (void)c;
    (void)code;
    free(*con_cls);
    *con_cls = NULL;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *data,
                              size_t *data_size, void **con_cls)
{
    upload *u = *con_cls;
    char text[70000], loc[128];
    json_t *args;

    (void)cls;
    (void)version;
    if (!u) {
        *con_cls = calloc(1, sizeof(upload));
        return MHD_YES;
    }
    if (*data_size) {
        size_t n = *data_size < sizeof(u->body) - u->len
                       ? *data_size
                       : sizeof(u->body) - u->len;

        memcpy(u->body + u->len, data, n);
        u->len += n;
        *data_size = 0;
        return MHD_YES;
    }
    args = json_array();
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_arg, args);
    pthread_mutex_lock(&seen_lock);
    seen.count++;
    snprintf(seen.method, sizeof(seen.method), "%s", method);
    snprintf(seen.path, sizeof(seen.path), "%s", url);
    json_decref(seen.args);
    seen.args = args;
    copy_header(c, "Authorization", seen.auth, sizeof(seen.auth));
    copy_header(c, "X-Custom", seen.custom, sizeof(seen.custom));
    copy_header(c, "Content-Type", seen.type, sizeof(seen.type));
    copy_header(c, "User-Agent", seen.agent, sizeof(seen.agent));
    copy_header(c, "Accept", seen.accept, sizeof(seen.accept));
    memcpy(seen.body, u->body, u->len);
    seen.body_len = u->len;
    seen.body[u->len] = '\0';
    pthread_mutex_unlock(&seen_lock);

    if (strcmp(url, "/items") == 0) {
        snprintf(text, sizeof(text), "{\"id\":7,\"method\":\"%s\"}", method);
        return reply(c, strcmp(method, "POST") == 0 ? 201 : 200,
                     "application/json", text, strlen(text), NULL);
    }
    if (strcmp(url, "/missing") == 0)
        return reply(c, 404, "application/json",
                     "{\"error\":\"no such item\"}", 24, NULL);
    if (strcmp(url, "/redirect") == 0) {
        snprintf(loc, sizeof(loc), "http://127.0.0.1:%d/items", port);
        return reply(c, 302, "text/plain", "moved", 5, loc);
    }
    if (strcmp(url, "/big") == 0) {
        memset(text, 'b', 2048);
        return reply(c, 200, "text/plain", text, 2048, NULL);
    }
    if (strcmp(url, "/long") == 0) {
        memset(text, 'l', 5000);
        return reply(c, 200, "text/plain; charset=utf-8", text, 5000, NULL);
    }
    if (strcmp(url, "/binary") == 0)
        return reply(c, 200, "image/png", "\x89PNG\r\n\x1a\n", 8, NULL);
    if (strcmp(url, "/slow") == 0) {
        struct MHD_Response *r = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 1, slow_read, NULL, NULL);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);

        MHD_destroy_response(r);
        return ret;
    }
    return reply(c, 404, "text/plain", "unknown", 7, NULL);
}

static int test_resolve(const char *host, struct sockaddr_storage *addrs,
                        size_t max, size_t *n, void *payload)
{
    (void)payload;
    (void)max;
    if (strcmp(host, "public.test") != 0)
        return loom__error_set(LOOM_ENOTFOUND, "could not resolve '%s'",
                               host);
    memset(addrs, 0, sizeof(*addrs));
    addrs->ss_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1",
              &((struct sockaddr_in *)addrs)->sin_addr);
    *n = 1;
    return 0;
}

static int setup(void **state)
{
    struct sockaddr_in sa;

    (void)state;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    daemon_ = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
        NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_END);
    if (!daemon_)
        return -1;
    port = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT)->port;
    loom__net_set_resolver(test_resolve, NULL);
    setenv("LOOM_TEST_SECRET", "s3cret", 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    loom__net_set_resolver(NULL, NULL);
    MHD_stop_daemon(daemon_);
    json_decref(seen.args);
    return 0;
}

/* ---- helpers */

/* The test config, with the server's port in every URL. */
static char *config_text(void)
{
    char *y;

    assert_true(
        asprintf(
            &y,
            "http_tools:\n"
            "  create_item:\n"
            "    description: Create an item.\n"
            "    method: post\n"
            "    url: http://127.0.0.1:%1$d/items\n"
            "    headers:\n"
            "      Authorization: Bearer ${LOOM_TEST_SECRET}\n"
            "      X-Custom: hello\n"
            "    parameters:\n"
            "      type: object\n"
            "      properties:\n"
            "        title: {type: string}\n"
            "        count: {type: integer}\n"
            "      required: [title]\n"
            "    allow_hosts: ['127.0.0.1:%1$d']\n"
            "  find_items:\n"
            "    description: Find items.\n"
            "    method: GET\n"
            "    url: http://127.0.0.1:%1$d/items?fixed=1\n"
            "    allow_hosts: ['127.0.0.1:%1$d']\n"
            "  update_item: {description: Replace an item., method: PUT,\n"
            "                url: 'http://127.0.0.1:%1$d/items',\n"
            "                allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  patch_item: {description: Change an item., method: PATCH,\n"
            "               url: 'http://127.0.0.1:%1$d/items',\n"
            "               allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  delete_item: {description: Delete an item., method: DELETE,\n"
            "                url: 'http://127.0.0.1:%1$d/items',\n"
            "                allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  by_name: {description: Through a name.,\n"
            "            url: 'http://public.test:%1$d/items',\n"
            "            allow_hosts: ['public.test:%1$d']}\n"
            "  missing: {description: Not there., url: "
            "'http://127.0.0.1:%1$d/missing',\n"
            "            allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  moved: {description: Moved., method: GET,\n"
            "          url: 'http://127.0.0.1:%1$d/redirect',\n"
            "          allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  small: {description: Too big., method: GET, max_bytes: 1024,\n"
            "          url: 'http://127.0.0.1:%1$d/big',\n"
            "          allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  slow: {description: Too slow., method: GET, timeout_ms: 500,\n"
            "         url: 'http://127.0.0.1:%1$d/slow',\n"
            "         allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  long: {description: Long., method: GET, max_chars: 100,\n"
            "         url: 'http://127.0.0.1:%1$d/long',\n"
            "         allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  binary: {description: Binary., method: GET,\n"
            "           url: 'http://127.0.0.1:%1$d/binary',\n"
            "           allow_hosts: ['127.0.0.1:%1$d']}\n"
            "  not_allowed: {description: Not allowlisted.,\n"
            "                url: 'http://127.0.0.1:%1$d/items'}\n",
            port) > 0);
    return y;
}

static loom_tool_registry *registry(void)
{
    loom_tool_registry *reg = NULL;
    loom_config *cfg = NULL;
    char *y = config_text();

    if (loom_config_load_string(&cfg, y, "tools.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(y);
    assert_int_equal(cfg->http_tools_len, 13);
    assert_string_equal(cfg->http_tools[0].name, "create_item");
    assert_string_equal(cfg->http_tools[0].method, "POST");
    assert_string_equal(json_string_value(json_object_get(
                            cfg->http_tools[0].headers, "Authorization")),
                        "Bearer s3cret");
    assert_string_equal(cfg->http_tools[5].method, "POST"); /* default */
    assert_string_equal(json_string_value(json_object_get(
                            cfg->http_tools[5].parameters, "type")),
                        "object");
    assert_int_equal(cfg->http_tools[5].timeout_ms, 30000);
    assert_int_equal(cfg->http_tools[5].max_bytes, 1 << 20);
    assert_int_equal(cfg->http_tools[5].max_chars, 20000);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_from_config(reg, cfg), 0);
    /* the tools keep their own copies */
    loom_config_free(cfg);
    return reg;
}

typedef struct {
    int rc;
    loom_buf out;
} result;

static result call(loom_tool_registry *reg, const char *name,
                   const char *args)
{
    const loom_tool *t = loom_tool_registry_get(reg, name);
    json_t *a = json_loads(args, 0, NULL);
    loom_tool_ctx ctx;
    result r;

    assert_non_null(t);
    assert_non_null(a);
    memset(&ctx, 0, sizeof(ctx));
    ctx.tool_name = name;
    loom_buf_init(&r.out, 1 << 20);
    r.rc = t->execute(a, &ctx, &r.out, t->payload);
    json_decref(a);
    return r;
}

static void has(const result *r, const char *part)
{
    if (!strstr(loom_buf_cstr(&r->out), part))
        fail_msg("result lacks '%s':\n%s", part, loom_buf_cstr(&r->out));
}

static void expect_rc(const result *r, int rc)
{
    if (r->rc != rc)
        fail_msg("want %d, got %d: %s", rc, r->rc, loom_buf_cstr(&r->out));
}

/* The server's args as "k=v&k=v" (decoded), for comparisons. */
static void seen_args(char *dst, size_t cap)
{
    size_t len = 0, i;
    json_t *pair;

    dst[0] = '\0';
    json_array_foreach(seen.args, i, pair)
        len += (size_t)snprintf(dst + len, cap - len, "%s%s=%s",
                                i ? "&" : "",
                                json_string_value(json_array_get(pair, 0)),
                                json_string_value(json_array_get(pair, 1)));
}

/* ---- tests */

static void test_post_body_and_headers(void **state)
{
    loom_tool_registry *reg = registry();
    const loom_tool *t = loom_tool_registry_get(reg, "create_item");
    result r;

    (void)state;
    assert_string_equal(t->description, "Create an item.");
    assert_non_null(json_object_get(t->parameters, "required"));
    r = call(reg, "create_item", "{\"title\":\"Fix the roof\",\"count\":3}");
    expect_rc(&r, 0);
    assert_string_equal(r.out.ptr, "HTTP 201\nContent-Type: application/json"
                                   "\n\n{\"id\":7,\"method\":\"POST\"}");
    assert_string_equal(seen.method, "POST");
    assert_string_equal(seen.path, "/items");
    assert_string_equal(seen.body, "{\"title\":\"Fix the roof\",\"count\":3}");
    assert_string_equal(seen.auth, "Bearer s3cret");
    assert_string_equal(seen.custom, "hello");
    assert_string_equal(seen.type, "application/json");
    assert_true(strncmp(seen.agent, "loom/", 5) == 0);
    assert_string_equal(seen.accept, "application/json, text/*;q=0.9, "
                                     "*/*;q=0.1");
    assert_int_equal(json_array_size(seen.args), 0);
    loom_buf_free(&r.out);

    r = call(reg, "update_item", "{\"title\":\"x\"}");
    expect_rc(&r, 0);
    assert_string_equal(seen.method, "PUT");
    assert_string_equal(seen.body, "{\"title\":\"x\"}");
    loom_buf_free(&r.out);
    r = call(reg, "patch_item", "{}");
    expect_rc(&r, 0);
    assert_string_equal(seen.method, "PATCH");
    assert_string_equal(seen.body, "{}");
    loom_buf_free(&r.out);
    /* a name through the resolver, allowlisted by name */
    r = call(reg, "by_name", "{\"a\":1}");
    expect_rc(&r, 0);
    has(&r, "HTTP 201");
    loom_buf_free(&r.out);
    loom_tool_registry_free(reg);
}

static void test_get_query(void **state)
{
    loom_tool_registry *reg = registry();
    char args[512], *big;
    result r;

    (void)state;
    r = call(reg, "find_items",
             "{\"q\":\"a b&c=d\",\"n\":2,\"tags\":[\"x\",\"y\"],"
             "\"none\":null,\"obj\":{\"k\":true},\"e\":\"\\u00e9\"}");
    expect_rc(&r, 0);
    has(&r, "HTTP 200\n");
    assert_string_equal(seen.method, "GET");
    assert_int_equal(seen.body_len, 0);
    assert_string_equal(seen.type, "");
    seen_args(args, sizeof(args));
    assert_string_equal(args, "fixed=1&q=a b&c=d&n=2&tags=x&tags=y&"
                              "obj={\"k\":true}&e=\xc3\xa9");
    loom_buf_free(&r.out);

    r = call(reg, "delete_item", "{\"id\":7}");
    expect_rc(&r, 0);
    assert_string_equal(seen.method, "DELETE");
    seen_args(args, sizeof(args));
    assert_string_equal(args, "id=7");
    loom_buf_free(&r.out);

    /* arguments that make the URL too long */
    big = malloc(LOOM__NET_MAX_URL + 64);
    memcpy(big, "{\"q\":\"", 6);
    memset(big + 6, 'q', LOOM__NET_MAX_URL);
    strcpy(big + 6 + LOOM__NET_MAX_URL, "\"}");
    r = call(reg, "find_items", big);
    free(big);
    expect_rc(&r, LOOM_ETOOLARGE);
    has(&r, "find_items: the arguments make the URL longer than 8192");
    loom_buf_free(&r.out);
    loom_tool_registry_free(reg);
}

static void test_results_and_limits(void **state)
{
    loom_tool_registry *reg = registry();
    char want[128];
    int before;
    result r;

    (void)state;
    /* an error status is a failed call that still shows the body */
    r = call(reg, "missing", "{}");
    expect_rc(&r, LOOM_ERROR);
    assert_string_equal(r.out.ptr, "HTTP 404\nContent-Type: application/json"
                                   "\n\n{\"error\":\"no such item\"}");
    loom_buf_free(&r.out);

    /* a redirect is returned, not followed */
    before = seen.count;
    r = call(reg, "moved", "{}");
    expect_rc(&r, 0);
    snprintf(want, sizeof(want),
             "HTTP 302\nContent-Type: text/plain\nLocation: "
             "http://127.0.0.1:%d/items\n\nmoved",
             port);
    assert_string_equal(r.out.ptr, want);
    assert_int_equal(seen.count, before + 1);
    loom_buf_free(&r.out);

    r = call(reg, "small", "{}");
    expect_rc(&r, LOOM_ETOOLARGE);
    has(&r, "small: the response of http://127.0.0.1:");
    has(&r, "is larger than max_bytes (1024 bytes)");
    loom_buf_free(&r.out);

    r = call(reg, "slow", "{}");
    expect_rc(&r, LOOM_ETIMEDOUT);
    has(&r, "timed out");
    loom_buf_free(&r.out);

    r = call(reg, "long", "{}");
    expect_rc(&r, 0);
    has(&r, "HTTP 200\nContent-Type: text/plain\n\nllll");
    has(&r, "\n[cut: showing the first 100 of 5000 characters of the body]");
    assert_true(r.out.len < 300);
    loom_buf_free(&r.out);

    r = call(reg, "binary", "{}");
    expect_rc(&r, 0);
    has(&r, "(8 bytes of image/png, not shown)");
    loom_buf_free(&r.out);
    loom_tool_registry_free(reg);
}

static void test_not_allowlisted(void **state)
{
    loom_tool_registry *reg = registry();
    int before = seen.count;
    result r;

    (void)state;
    r = call(reg, "not_allowed", "{\"title\":\"x\"}");
    expect_rc(&r, LOOM_ERROR);
    has(&r, "not_allowed: blocked by policy: port");
    loom_buf_free(&r.out);
    assert_int_equal(seen.count, before);
    loom_tool_registry_free(reg);
}

/* Loads yaml; expects LOOM_EINVALID (or the given code) naming part. */
static void bad_config(const char *yaml, const char *part)
{
    loom_config *cfg = NULL;
    int rc = loom_config_load_string(&cfg, yaml, "t.yaml");

    if (rc == 0) {
        loom_config_free(cfg);
        fail_msg("accepted:\n%s", yaml);
    }
    assert_null(cfg);
    if (!strstr(loom_error_last(), part))
        fail_msg("'%s' lacks '%s'", loom_error_last(), part);
}

static void test_config_errors(void **state)
{
    (void)state;
    bad_config("http_tools:\n  t: {url: 'http://x.test/'}\n",
               "t.yaml:2: http_tools.t: missing required key 'description'");
    bad_config("http_tools:\n  t: {description: d}\n",
               "http_tools.t: missing required key 'url'");
    bad_config("http_tools:\n  t: {description: d, url: 'ftp://x/'}\n",
               "http_tools.t.url: must be an http:// or https:// URL");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      method: FETCH}\n",
               "t.yaml:3: http_tools.t.method: must be GET, POST, PUT, "
               "PATCH or DELETE, got 'FETCH'");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      parameters: {type: string}}\n",
               "http_tools.t.parameters: type must be object");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      parameters: [a]}\n",
               "must be a JSON Schema mapping");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      allow_hosts: x}\n",
               "http_tools.t.allow_hosts: must be a list of hosts");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      allow_hosts: ['a b']}\n",
               "http_tools.t.allow_hosts[0]: 'a b' is not a host");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      timeout_ms: 99}\n",
               "http_tools.t.timeout_ms: must be an integer from 100 to "
               "300000");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      max_bytes: 1023}\n",
               "http_tools.t.max_bytes: must be an integer from 1024");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      max_chars: 99}\n",
               "http_tools.t.max_chars: must be an integer from 100");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      headers: {'Bad Name': v}}\n",
               "is not a valid HTTP header name");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      headers: {A: '${LOOM_TEST_UNSET_VAR}'}}\n",
               "environment variable LOOM_TEST_UNSET_VAR is not set");
    bad_config("http_tools:\n  t: {description: d, url: 'http://x/',\n"
               "      verb: GET}\n",
               "unknown key 'verb'");
    bad_config("http_tools:\n  bad.name: {description: d, url: "
               "'http://x/'}\n",
               "'bad.name' is not a valid tool name");
    bad_config("http_tools: [a]\n", "http_tools: must be a mapping");
}

static void test_registration_errors(void **state)
{
    loom_tool_registry *reg = NULL;
    loom_config *cfg = NULL;

    (void)state;
    /* an allowlist entry only the tools layer can judge */
    assert_int_equal(loom_config_load_string(
                         &cfg,
                         "http_tools:\n  t: {description: d, url: "
                         "'http://x/', allow_hosts: ['[::1']}\n",
                         "t.yaml"),
                     0);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_from_config(reg, cfg), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(),
                           "http_tools.t: allow_hosts entry '[::1'"));
    assert_int_equal(loom_tool_registry_count(reg), 0);
    loom_config_free(cfg);

    /* a name a built-in already has */
    assert_int_equal(loom_config_load_string(
                         &cfg,
                         "http_tools:\n  web_fetch: {description: d, url: "
                         "'http://x/'}\n",
                         "t.yaml"),
                     0);
    assert_int_equal(loom_tools_add_builtins(reg), 0);
    assert_int_equal(loom_tools_add_from_config(reg, cfg), LOOM_EEXISTS);
    loom_config_free(cfg);
    assert_int_equal(loom_tools_add_from_config(NULL, NULL), LOOM_EINVALID);

    /* a config without http_tools adds nothing */
    assert_int_equal(loom_config_load_string(&cfg, "", "t.yaml"), 0);
    assert_int_equal(loom_tools_add_from_config(reg, cfg), 0);
    loom_config_free(cfg);
    loom_tool_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_post_body_and_headers),
        cmocka_unit_test(test_get_query),
        cmocka_unit_test(test_results_and_limits),
        cmocka_unit_test(test_not_allowlisted),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_registration_errors),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
