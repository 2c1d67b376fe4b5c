/*
 * The scripted provider of mock_provider.h. complete() first records the
 * request (mock_seen), then plays answer k: a wait for cancellation, a
 * failure, or the text delta, the call deltas (MOCK_STREAM_CALLS), the
 * text after them, and the whole response (text, calls, usage, through
 * m->usage when set, finish reason "tool_calls" or "stop", provider_state
 * with MOCK_STATE). A callback that asks to stop ends the call with
 * LOOM_ECANCELED, as the adapters do. Allocation failures are test
 * failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mock_provider.h"

#include "loom/buf.h"
#include "loom/cancel.h"
#include "loom/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *dup_or_null(const char *s)
{
    char *r;

    if (!s)
        return NULL;
    r = strdup(s);
    assert_non_null(r);
    return r;
}

static char *buf_take(loom_buf *b)
{
    char *r = dup_or_null(loom_buf_cstr(b));

    loom_buf_free(b);
    return r;
}

static void record(mock_seen *s, const loom_llm_request *req)
{
    loom_buf names = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf roles = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf texts = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    s->tools_len = req->tools_len;
    for (size_t i = 0; i < req->tools_len; i++)
        assert_int_equal(loom_buf_printf(&names, "%s%s", i ? "," : "",
                                         req->tools[i].name),
                         0);
    s->tools = buf_take(&names);
    s->choice = req->tool_choice.kind;
    s->choice_fn = dup_or_null(req->tool_choice.function);
    s->model = dup_or_null(req->model);
    s->nmsg = req->messages_len;
    for (size_t i = 0; i < req->messages_len; i++)
        assert_int_equal(loom_buf_printf(&roles, "%.1s",
                                         loom_role_name(req->messages[i].role)),
                         0);
    s->all_roles = buf_take(&roles);
    for (size_t i = 0; i < req->messages_len; i++) {
        const loom_message *msg = &req->messages[i];

        if (msg->role == LOOM_ROLE_TOOL)
            assert_int_equal(loom_buf_printf(&texts, "%s%s",
                                             texts.len ? "|" : "",
                                             msg->content ? msg->content : ""),
                             0);
        s->nsystem += msg->role == LOOM_ROLE_SYSTEM;
        if (msg->role == LOOM_ROLE_TOOL && !s->first_tool)
            s->first_tool = dup_or_null(msg->content);
        if (msg->role == LOOM_ROLE_USER && !s->first_user)
            s->first_user = dup_or_null(msg->content);
    }
    s->tool_texts = buf_take(&texts);
    if (req->messages_len) {
        const loom_message *last = &req->messages[req->messages_len - 1];

        s->last_role = last->role;
        s->last_content = dup_or_null(last->content);
        if (req->messages[0].role == LOOM_ROLE_SYSTEM)
            s->system = dup_or_null(req->messages[0].content);
    }
}

static int emit_text(const char *text, loom_llm_event_cb cb, void *payload)
{
    loom_llm_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_LLM_TEXT;
    ev.text = text;
    ev.text_len = strlen(text);
    return cb(&ev, payload);
}

/* Call i of a in resp (zeroed). */
static void fill_call(loom_tool_call *c, const mock_answer *a, int i)
{
    char id[32];
    loom_buf args = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *t, *at;

    if (a->many <= 0) {
        c->id = dup_or_null(a->calls[i][0]);
        c->name = dup_or_null(a->calls[i][1]);
        c->arguments = dup_or_null(a->calls[i][2]);
        return;
    }
    t = a->calls[0][2];
    at = strstr(t, "%d");
    assert_non_null(at);
    snprintf(id, sizeof(id), "m%d", i);
    assert_int_equal(loom_buf_printf(&args, "%.*s%d%s", (int)(at - t), t, i,
                                     at + 2),
                     0);
    c->id = dup_or_null(id);
    c->name = dup_or_null(a->calls[0][1]);
    c->arguments = buf_take(&args);
}

static int mock_complete(loom_provider *p, const loom_llm_request *req,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp, loom_cancel *cancel)
{
    mock_provider *m = (mock_provider *)p;
    const mock_answer *a;
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    int n;

    assert_true(m->next < m->n);
    assert_true(m->next < MOCK_MAX_TURNS);
    a = &m->answers[m->next];
    record(&m->seen[m->next++], req);

    if (a->wait_cancel) {
        while (!loom_cancel_is_set(cancel))
            usleep(1000);
        resp->text = dup_or_null("partial");
        return LOOM_ECANCELED;
    }
    if (a->fail_rc) {
        resp->error.kind = LOOM_UPSTREAM_SERVER;
        resp->error.http_status = 500;
        resp->error.attempts = 3;
        return a->fail_rc;
    }
    if (a->text && emit_text(a->text, cb, payload))
        return LOOM_ECANCELED;
    /* Each call's first fragment, as an adapter streams it. */
    for (int i = 0; (m->flags & MOCK_STREAM_CALLS) && i < a->ncalls; i++) {
        loom_llm_event ev;

        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALL_DELTA;
        ev.tool_index = i;
        ev.tool_id = a->calls[i][0];
        ev.tool_name = a->calls[i][1];
        ev.args_delta = a->calls[i][2];
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
    }
    if (a->text_after && emit_text(a->text_after, cb, payload))
        return LOOM_ECANCELED;

    assert_int_equal(loom_buf_printf(&text, "%s%s", a->text ? a->text : "",
                                     a->text_after ? a->text_after : ""),
                     0);
    resp->text = buf_take(&text);
    n = a->many > 0 ? a->many : a->ncalls;
    if (n) {
        resp->tool_calls = calloc((size_t)n, sizeof(loom_tool_call));
        assert_non_null(resp->tool_calls);
        resp->tool_calls_len = (size_t)n;
        for (int i = 0; i < n; i++)
            fill_call(&resp->tool_calls[i], a, i);
    }
    resp->usage.prompt_tokens = a->prompt;
    resp->usage.completion_tokens = a->completion;
    resp->usage.total_tokens = a->prompt + a->completion;
    if (m->usage)
        m->usage(req, &resp->usage, m->usage_payload);
    resp->finish_reason = dup_or_null(n ? "tool_calls" : "stop");
    if (m->flags & MOCK_STATE) {
        char st[64];

        snprintf(st, sizeof(st), "{\"mock\":{\"turn\":%d}}", m->next);
        resp->provider_state = dup_or_null(st);
    }
    return 0;
}

/* The mock lives in the caller's memory: nothing to free here. */
static void mock_free(loom_provider *p)
{
    (void)p;
}

static const loom_provider_vtable mock_vt = {.version =
                                                 LOOM_PROVIDER_VTABLE_VERSION,
                                             .complete = mock_complete,
                                             .free = mock_free};

void mock_init(mock_provider *m, const mock_answer *answers, int n,
               unsigned flags)
{
    memset(m, 0, sizeof(*m));
    m->base.vt = &mock_vt;
    m->answers = answers;
    m->n = n;
    m->flags = flags;
}

void mock_clear(mock_provider *m)
{
    for (int i = 0; i < m->next && i < MOCK_MAX_TURNS; i++) {
        mock_seen *s = &m->seen[i];

        free(s->tools);
        free(s->last_content);
        free(s->all_roles);
        free(s->system);
        free(s->first_tool);
        free(s->tool_texts);
        free(s->choice_fn);
        free(s->model);
        free(s->first_user);
        memset(s, 0, sizeof(*s));
    }
    m->next = 0;
}
