/*
 * Users connecting their own MCP accounts through loom serve (api_mcp.c,
 * docs/mcp.md "Connecting your own account"), end to end against
 * tests/mcp/fake_oauth_mcp.mjs (an MCP server with its own authorization
 * server, whose /authorize sends the browser straight back; libcurl
 * plays the browser). With keys: alice lists the server as not
 * connected, connects (POST .../connect gives the authorization URL,
 * which leads through the authorization server to loom's callback, which
 * says connected), and her run's call carries her own token while bob,
 * not connected, sees connected:false and his call sends nobody's
 * token. A state is good once; an unknown or expired one is refused; the
 * authorization server's error is shown as text; one user's state
 * completes that user's connection only; DELETE disconnects (her next
 * call is refused again, bob's connection stays).
 */
#include "server_accounts_util.h"

#include "core/error.h"
#include "loom/accounts.h"
#include "loom/mcp.h"
#include "server/srvpriv.h"

#include <sys/types.h>

#define SECRET_KEY "test-secret-for-mcp-connect"

/* The fake authorization server and MCP server. */
typedef struct {
    pid_t pid;
    int port;
    char base[64];
    char log[512];
} oauth_fake;

static void oauth_start(oauth_fake *o)
{
    int out[2];
    char line[64] = {0};
    size_t got = 0;
    static int n;

    memset(o, 0, sizeof(*o));
    snprintf(o->log, sizeof(o->log), "%s/mcp-connect-%d-%d.log", test_tmp_dir(),
             (int)getpid(), n++);
    unlink(o->log);
    assert_int_equal(pipe(out), 0);
    o->pid = fork();
    assert_true(o->pid >= 0);
    if (o->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(out[1], 1);
        close(out[0]);
        setenv("FAKE_OAUTH_LOG", o->log, 1);
        execlp("node", "node", LOOM_SOURCE_DIR "/tests/mcp/fake_oauth_mcp.mjs",
               (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    while (got < sizeof(line) - 1 && read(out[0], line + got, 1) == 1 &&
           line[got] != '\n')
        got++;
    close(out[0]);
    if (sscanf(line, "port %d", &o->port) != 1)
        fail_msg("the fake OAuth server did not start: '%s'", line);
    snprintf(o->base, sizeof(o->base), "http://127.0.0.1:%d", o->port);
}

static void oauth_stop(oauth_fake *o)
{
    kill(o->pid, SIGTERM);
    waitpid(o->pid, NULL, 0);
    unlink(o->log);
}

/* How many lines of the fake's log are line exactly. */
static int log_count(const oauth_fake *o, const char *line)
{
    char buf[512];
    FILE *f = fopen(o->log, "r");
    int n = 0;

    if (!f)
        return 0;
    while (fgets(buf, sizeof(buf), f)) {
        buf[strcspn(buf, "\n")] = '\0';
        n += !strcmp(buf, line);
    }
    fclose(f);
    return n;
}

/* ---- the browser ------------------------------------------------------- */

/* GET url; the status, and the body and the Location header (each may
 * be NULL) in new strings. */
static long browse(const char *url, char **body, char **location)
{
    sh_resp r;
    CURL *c = curl_easy_init();
    const char *loc;
    long status = 0;
    char *l = NULL;

    memset(&r, 0, sizeof(r));
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sh_on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(c) != CURLE_OK)
        fail_msg("GET %s failed", url);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &l) == CURLE_OK && l)
        loc = l;
    else
        loc = NULL;
    if (location)
        *location = loc ? strdup(loc) : NULL;
    if (body)
        *body = r.body ? strdup(r.body) : strdup("");
    curl_easy_cleanup(c);
    sh_resp_free(&r);
    return status;
}

/* The authorizer of the server's own credentials: the browser that
 * follows the authorization server's redirect. */
static int own_redirect(void *arg, char *uri, size_t cap)
{
    (void)arg;
    snprintf(uri, cap, "http://127.0.0.1:9/callback");
    return 0;
}

static int own_authorize(void *arg, const char *url, char **callback)
{
    (void)arg;
    if (browse(url, NULL, callback) != 302 || !*callback)
        return loom__error_set(LOOM_ERROR, "no redirect");
    return 0;
}

/* Credentials kept in the store, as loom serve keeps them. */
static int creds_load(void *arg, const char *server, const char *user,
                      char **json)
{
    return loom_store_mcp_credentials_load(arg, server, user, json);
}

static int creds_save(void *arg, const char *server, const char *user,
                      const char *json)
{
    return loom_store_mcp_credentials_save(arg, server, user, json);
}

/* ---- the server -------------------------------------------------------- */

typedef struct {
    sh h;
    oauth_fake o;
    loom_mcp_set *set;
    loom_mcp_credentials creds;
    loom_mcp_authorizer az;
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], carol[LOOM_KEY_SIZE];
} world;

static void key_for(world *w, const char *user, char key[LOOM_KEY_SIZE])
{
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = user};

    if (loom_store_key_create(w->h.store, &spec, key, NULL) != 0)
        fail_msg("key: %s", loom_error_last());
}

/* The fake model answers each run with a call of web__whoami, then
 * text; the server lists the MCP server's tools with its own account,
 * and its users' calls go with their own. */
static void start(world *w, int runs)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_mcp_setup setup;
    loom_buf script;
    char *yaml = NULL;
    static int n;
    char name[64];
    sh *h = &w->h;

    memset(w, 0, sizeof(*w));
    oauth_start(&w->o);
    loom_buf_init(&script, 1 << 20);
    loom_buf_puts(&script, "{\"responses\":[");
    for (int i = 0; i < runs; i++)
        loom_buf_printf(&script,
                        "%s{\"tool_calls\":[{\"id\":\"c%d\",\"name\":"
                        "\"web__whoami\",\"arguments\":\"{}\"}]},"
                        "{\"text\":[\"done\"]}",
                        i ? "," : "", i);
    loom_buf_puts(&script, "]}");
    h->fake = fake_start_script(loom_buf_cstr(&script));
    loom_buf_free(&script);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "mcp-connect-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "agents:\n"
                         "  a: {model: fake/m, tools: [web__whoami], "
                         "memory: false}\n"
                         "default_agent: a\n"
                         "mcp_servers:\n"
                         "  web: {url: \"%s/mcp\"}\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "auth:\n"
                         "  mode: keys\n",
                         fake_base_url(h->fake), w->o.base) > 0);
    if (loom_config_load_string(&h->cfg, yaml, "test.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    if (loom_store_open(&h->store, h->db) != 0 ||
        loom_store_set_secret(h->store, SECRET_KEY) != 0)
        fail_msg("store: %s", loom_error_last());
    assert_int_equal(loom_mcp_set_new(&w->set), 0);
    w->creds.load = creds_load;
    w->creds.save = creds_save;
    w->creds.arg = h->store;
    w->az.redirect_uri = own_redirect;
    w->az.authorize = own_authorize;
    memset(&setup, 0, sizeof(setup));
    setup.credentials = &w->creds;
    setup.authorizer = &w->az;
    setup.servers = w->set;
    setup.per_user = 1;
    if (loom_tools_new_from_config_with(&h->tools, h->cfg, &setup) != 0)
        fail_msg("tools: %s", loom_error_last());
    so.config = h->cfg;
    so.store = h->store;
    so.tools = h->tools;
    so.mcp_servers = w->set;
    if (loom_server_new(&h->srv, &so) != 0 || loom_server_start(h->srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%d",
             loom_server_port(h->srv));
    key_for(w, "alice", w->alice);
    key_for(w, "bob", w->bob);
    key_for(w, "carol", w->carol);
}

static void finish(world *w)
{
    loom_server_free(w->h.srv);
    w->h.srv = NULL;
    loom_tool_registry_free(w->h.tools);
    w->h.tools = NULL;
    loom_mcp_set_free(w->set);
    sh_free(&w->h);
    oauth_stop(&w->o);
    srv__mcp_flow_ttl_set(-1);
}

/* connected of server web in GET /v1/me/mcp as key. */
static int connected(world *w, const char *key)
{
    json_t *j = call_json(&w->h, key, NULL, "GET", "/v1/me/mcp", NULL, 200);
    json_t *data = json_object_get(j, "data"), *e = json_array_get(data, 0);
    int on;

    assert_int_equal(json_array_size(data), 1);
    assert_string_equal(sh_str(e, "name"), "web");
    assert_string_equal(sh_str(e, "auth"), "oauth");
    assert_true(json_is_boolean(json_object_get(e, "connected")));
    on = json_is_true(json_object_get(e, "connected"));
    json_decref(j);
    return on;
}

/* POST connect as key: the authorization URL (new string). */
static char *connect_url(world *w, const char *key)
{
    json_t *j = call_json(&w->h, key, NULL, "POST", "/v1/me/mcp/web/connect",
                          NULL, 200);
    const char *url = sh_str(j, "authorization_url");
    char *out;

    if (!url)
        fail_msg("no authorization_url");
    assert_true(json_is_false(json_object_get(j, "connected")));
    /* It sends the browser back to loom itself. */
    assert_non_null(strstr(url, "redirect_uri=http%3A%2F%2F127.0.0.1%3A"));
    assert_non_null(strstr(url, "%2Fv1%2Fmcp%2Foauth%2Fcallback"));
    out = strdup(url);
    json_decref(j);
    return out;
}

/* The authorization server's answer to url: where it sends the browser
 * (new string), which is loom's callback. Not inlined: GCC 12 at -O3 then
 * takes a pointer into the returned string for one into the local `back`
 * (a false -Wdangling-pointer). */
__attribute__((noinline)) static char *consent(world *w, const char *url)
{
    char *back = NULL;

    assert_int_equal(browse(url, NULL, &back), 302);
    assert_non_null(back);
    assert_true(!strncmp(back, w->h.base, strlen(w->h.base)));
    return back;
}

/* GET the callback url: its status, and the page must hold text. */
static void callback(const char *url, long want, const char *text)
{
    char *body = NULL;
    long got = browse(url, &body, NULL);

    if (got != want || !strstr(body, text))
        fail_msg("callback: %ld (want %ld), page lacks '%s':\n%s", got, want,
                 text, body);
    free(body);
}

/* A run of agent a as key; the tool result the model was given (its
 * request number req). */
static char *run_as(world *w, const char *key, size_t req)
{
    json_t *j = call_json(&w->h, key, NULL, "POST", "/v1/chat/completions",
                          "{\"model\":\"agent/a\",\"messages\":[{\"role\":"
                          "\"user\",\"content\":\"who am I?\"}]}",
                          200);
    json_decref(j);
    return tool_result(&w->h, req);
}

static void test_connect_flow(void **state)
{
    world w;
    char *url, *back, *url2, *back2, *res;
    int own_calls;

    (void)state;
    start(&w, 4);
    /* The server's own account listed the tools: client-1. */
    own_calls = log_count(&w.o, "POST /register -");
    assert_int_equal(own_calls, 1);

    /* Nobody is connected; bob's call sends no token of anyone's. */
    assert_false(connected(&w, w.alice));
    assert_false(connected(&w, w.bob));
    res = run_as(&w, w.bob, 1);
    assert_non_null(strstr(res, "needs your own account"));
    free(res);
    assert_int_equal(log_count(&w.o, "call client-1"), 0);

    /* alice connects: her own client (client-2) and tokens. */
    url = connect_url(&w, w.alice);
    back = consent(&w, url);
    callback(back, 200, "is connected");
    assert_true(connected(&w, w.alice));
    assert_false(connected(&w, w.bob));
    assert_int_equal(log_count(&w.o, "POST /register -"), 2);

    /* The state was good once. */
    callback(back, 400, "already used");
    assert_true(connected(&w, w.alice));

    /* Her run calls with her token; bob's still with nobody's. */
    res = run_as(&w, w.alice, 3);
    assert_non_null(strstr(res, "hello client-2"));
    free(res);
    res = run_as(&w, w.bob, 5);
    assert_non_null(strstr(res, "needs your own account"));
    free(res);
    assert_int_equal(log_count(&w.o, "call client-2"), 1);
    assert_int_equal(log_count(&w.o, "call client-1"), 0);
    assert_int_equal(log_count(&w.o, "call client-3"), 0);

    /* Connecting again with tokens that work: nothing to open. */
    {
        json_t *j = call_json(&w.h, w.alice, NULL, "POST",
                              "/v1/me/mcp/web/connect", NULL, 200);
        assert_true(json_is_true(json_object_get(j, "connected")));
        assert_null(json_object_get(j, "authorization_url"));
        json_decref(j);
    }

    /* bob and carol start at once; carol's answer completes carol's
     * connection only, bob's own is still good after. */
    url2 = connect_url(&w, w.bob);
    free(url);
    url = connect_url(&w, w.carol);
    free(back);
    back = consent(&w, url);
    callback(back, 200, "is connected");
    assert_true(connected(&w, w.carol));
    assert_false(connected(&w, w.bob));
    back2 = consent(&w, url2);
    callback(back2, 200, "is connected");
    assert_true(connected(&w, w.bob));
    free(url2);
    free(back2);

    /* alice disconnects: her next call is refused again; bob stays. */
    {
        json_t *j = call_json(&w.h, w.alice, NULL, "DELETE", "/v1/me/mcp/web",
                              NULL, 200);
        assert_true(json_is_false(json_object_get(j, "connected")));
        assert_true(json_is_true(json_object_get(j, "deleted")));
        json_decref(j);
    }
    assert_false(connected(&w, w.alice));
    assert_true(connected(&w, w.bob));
    res = run_as(&w, w.alice, 7);
    assert_non_null(strstr(res, "needs your own account"));
    free(res);
    assert_int_equal(log_count(&w.o, "call client-2"), 1);

    free(url);
    free(back);
    finish(&w);
}

static void test_refused_answers(void **state)
{
    world w;
    char *url, *back, *p, bad[1024];

    (void)state;
    start(&w, 0);

    /* No key, another server, no such route. */
    call_error(&w.h, NULL, NULL, "GET", "/v1/me/mcp", NULL, 401,
               "invalid_api_key");
    call_error(&w.h, w.alice, NULL, "POST", "/v1/me/mcp/nope/connect", NULL,
               404, "not_found");
    call_error(&w.h, w.alice, NULL, "DELETE", "/v1/me/mcp/nope", NULL, 404,
               "not_found");

    /* An unknown state, and none. */
    snprintf(bad, sizeof(bad), "%s/v1/mcp/oauth/callback?code=x&state=made-up",
             w.h.base);
    callback(bad, 400, "unknown to loom");
    snprintf(bad, sizeof(bad), "%s/v1/mcp/oauth/callback?code=x", w.h.base);
    callback(bad, 400, "unknown to loom");

    /* The authorization server's error, shown as text only. */
    url = connect_url(&w, w.alice);
    back = consent(&w, url);
    p = strstr(back, "code=");
    assert_non_null(p);
    snprintf(bad, sizeof(bad),
             "%.*serror=access_denied&error_description="
             "%%3Cscript%%3Ealert(1)%%3C%%2Fscript%%3E&%s",
             (int)(p - back), back, p);
    callback(bad, 502, "access_denied: &lt;script&gt;alert(1)&lt;/script&gt;");
    {
        char *body = NULL;
        browse(bad, &body, NULL);
        assert_null(strstr(body, "<script>"));
        free(body);
    }
    assert_false(connected(&w, w.alice));
    free(url);
    free(back);

    /* An expired state. */
    srv__mcp_flow_ttl_set(0);
    url = connect_url(&w, w.alice);
    back = consent(&w, url);
    callback(back, 400, "expired");
    assert_false(connected(&w, w.alice));
    srv__mcp_flow_ttl_set(-1);
    free(url);
    free(back);

    /* A newer connect ends the one before. */
    url = connect_url(&w, w.bob);
    back = consent(&w, url);
    free(url);
    url = connect_url(&w, w.bob);
    callback(back, 400, "replaced");
    free(back);
    back = consent(&w, url);
    callback(back, 200, "is connected");
    assert_true(connected(&w, w.bob));
    free(url);
    free(back);
    finish(&w);
}

static void test_client_of_another_redirect(void **state)
{
    world w;
    char *text = NULL, *url, *back;
    json_t *j, *e;
    const char *iss;

    (void)state;
    start(&w, 0);
    /* dave has a client registered for another redirect URI (what
     * `loom mcp login` registers), and no token: the server's own
     * credentials, tokens dropped. */
    assert_int_equal(
        loom_store_mcp_credentials_load(w.h.store, "web", "", &text), 0);
    j = json_loads(text, 0, NULL);
    free(text);
    iss = sh_str(j, "issuer");
    e = json_object_get(json_object_get(j, "issuers"), iss);
    assert_string_equal(sh_str(e, "client_id"), "client-1");
    json_object_del(e, "access_token");
    json_object_del(e, "refresh_token");
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    assert_int_equal(
        loom_store_mcp_credentials_save(w.h.store, "web", "default/dave", text),
        0);
    free(text);
    {
        char key[LOOM_KEY_SIZE];
        key_for(&w, "dave", key);
        assert_false(connected(&w, key));
        url = connect_url(&w, key);
        /* A client of its own for loom serve's callback. */
        assert_int_equal(log_count(&w.o, "POST /register -"), 2);
        assert_null(strstr(url, "client_id=client-1&"));
        assert_non_null(strstr(url, "client_id=client-2&"));
        back = consent(&w, url);
        callback(back, 200, "is connected");
        assert_true(connected(&w, key));
    }
    free(url);
    free(back);
    finish(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_flow),
        cmocka_unit_test(test_refused_answers),
        cmocka_unit_test(test_client_of_another_redirect),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
