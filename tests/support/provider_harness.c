/*
 * The provider tests' shared harness (see provider_harness.h): written
 * once here because the four adapters' end-to-end tests had grown the
 * same setup, call, teardown and comparison code each.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "provider_harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void provider_config(loom_provider_config *cfg, loom_fake *fake,
                     const char *base_url, const char *name, const char *kind,
                     const char *api_key, json_t *headers, int retries)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->name = (char *)name;
    cfg->kind = (char *)kind;
    cfg->base_url = (char *)(base_url ? base_url : fake_base_url(fake));
    cfg->api_key = (char *)api_key;
    cfg->headers = headers;
    cfg->connect_timeout_ms = 5000;
    cfg->first_byte_timeout_ms = 30000;
    cfg->idle_timeout_ms = 30000;
    cfg->max_retries = retries;
    cfg->retry_base_delay_ms = 10;
    cfg->retry_max_delay_ms = 50;
}

/* Records every event; aborts at a TEXT when asked to. */
static int on_event(const loom_llm_event *ev, void *payload)
{
    provider_ctx *c = payload;

    loom_buf_putc(&c->order, "TRDCUFE"[ev->type]);
    switch (ev->type) {
    case LOOM_LLM_TEXT:
        loom_buf_put(&c->events_text, ev->text, ev->text_len);
        return c->abort_on_text;
    case LOOM_LLM_REASONING:
        loom_buf_put(&c->events_reasoning, ev->text, ev->text_len);
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        c->ndeltas++;
        break;
    case LOOM_LLM_TOOL_CALLS:
        c->ncalls_events++;
        break;
    default:
        break;
    }
    return 0;
}

provider_ctx *provider_start(loom_fake *fake, const char *base_url,
                             const char *name, const char *kind,
                             const char *api_key, json_t *headers,
                             const char *model, int retries)
{
    provider_ctx *c = calloc(1, sizeof(*c));

    assert_non_null(c);
    assert_true(fake || base_url);
    c->fake = fake;
    provider_config(&c->cfg, fake, base_url, name, kind, api_key, headers,
                    retries);
    assert_int_equal(loom_provider_new(&c->p, &c->cfg), 0);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Hi"), 0);
    c->req = (loom_llm_request)LOOM_LLM_REQUEST_INIT;
    c->req.model = model;
    c->req.messages = c->msgs.items;
    c->req.messages_len = c->msgs.len;
    loom_buf_init(&c->events_text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->events_reasoning, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->order, LOOM_BUF_UNLIMITED);
    return c;
}

void provider_reconfigure(provider_ctx *c)
{
    loom_provider_free(c->p);
    assert_int_equal(loom_provider_new(&c->p, &c->cfg), 0);
}

int provider_run(provider_ctx *c, loom_cancel *cancel)
{
    int rc;

    c->req.messages = c->msgs.items;
    c->req.messages_len = c->msgs.len;
    loom_llm_response_clear(&c->resp);
    loom_buf_clear(&c->events_text);
    loom_buf_clear(&c->events_reasoning);
    loom_buf_clear(&c->order);
    c->ndeltas = c->ncalls_events = 0;
    rc = loom_provider_complete(c->p, &c->req, on_event, c, &c->resp, cancel);
    if (getenv("LOOM_TEST_VERBOSE"))
        fprintf(stderr, "  rc %s: %s\n", loom_error_name(rc),
                rc ? loom_error_last() : "");
    return rc;
}

/* What the canceling thread gets. */
typedef struct {
    loom_cancel *cancel;
    long after_ms;
} cancel_later;

static void *cancel_thread(void *arg)
{
    const cancel_later *cl = arg;
    struct timespec ts = {cl->after_ms / 1000,
                          (cl->after_ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
    loom_cancel_set(cl->cancel);
    return NULL;
}

int provider_run_canceled(provider_ctx *c, long after_ms)
{
    loom_cancel cancel = LOOM_CANCEL_INIT;
    cancel_later cl = {&cancel, after_ms};
    pthread_t th;
    int rc;

    assert_int_equal(pthread_create(&th, NULL, cancel_thread, &cl), 0);
    rc = provider_run(c, &cancel);
    pthread_join(th, NULL);
    return rc;
}

void provider_add_answer(provider_ctx *c)
{
    loom_message *m;

    assert_int_equal(
        loom_messages_add_assistant(&c->msgs, c->resp.text, c->resp.reasoning,
                                    c->resp.tool_calls, c->resp.tool_calls_len),
        0);
    m = &c->msgs.items[c->msgs.len - 1];
    if (c->resp.provider_state) {
        m->provider_state = strdup(c->resp.provider_state);
        assert_non_null(m->provider_state);
    }
}

int provider_stop(provider_ctx *c)
{
    int st = c->fake ? fake_stop_check(c->fake) : 0;

    loom_provider_free(c->p);
    json_decref(c->cfg.headers);
    loom_messages_free(&c->msgs);
    loom_llm_response_clear(&c->resp);
    loom_buf_free(&c->events_text);
    loom_buf_free(&c->events_reasoning);
    loom_buf_free(&c->order);
    free(c);
    return st;
}

json_t *provider_sent_body(loom_fake *fake, size_t i)
{
    json_t *r = fake_request(fake, i), *b;

    assert_non_null(r);
    b = json_incref(json_object_get(r, "body"));
    json_decref(r);
    assert_non_null(b);
    return b;
}

void assert_json(const json_t *v, const char *want)
{
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    char *s;

    assert_non_null(w);
    if (!v || !json_equal(v, w)) {
        s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        fprintf(stderr, "got:  %s\nwant: %s\n", s ? s : "(null)", want);
        free(s);
        json_decref(w);
        fail();
    }
    json_decref(w);
}

char *provider_quotes(const char *s)
{
    char *r = strdup(s);

    assert_non_null(r);
    for (char *p = r; *p; p++)
        if (*p == '\'')
            *p = '"';
    return r;
}

static int echo_exec(const json_t *args, const loom_tool_ctx *tctx,
                     loom_buf *out, void *payload)
{
    (void)tctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int fail_exec(const json_t *args, const loom_tool_ctx *tctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)tctx;
    (void)payload;
    loom_buf_puts(out, "disk on fire");
    return LOOM_ERROR;
}

loom_tool_registry *provider_tools(void)
{
    json_t *schema =
        json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                  "text", "type", "string", "required", "text");
    loom_tool_registry *reg = NULL;
    loom_tool t;

    assert_non_null(schema);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes text back.";
    t.parameters = schema;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.description = "Always fails.";
    t.parameters = NULL;
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(schema);
    return reg;
}
