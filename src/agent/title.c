/*
 * A conversation's title from a short model call (see title.h).
 */
#include "agent/title.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char LOOM_TITLE_PROMPT[] =
    "Write a short title for the conversation below: at most six words, "
    "in the language of the user's message, no quotes, no punctuation at "
    "the end. Answer with the title only.";

void loom__title_outcome_clear(loom__title_outcome *o)
{
    if (!o)
        return;
    free(o->title);
    free(o->model);
    memset(o, 0, sizeof(*o));
}

/* A blank or control character; never the terminating NUL. */
static int is_blank(unsigned char c)
{
    return c == ' ' || (c && c < 0x20) || c == 0x7f;
}

/* Characters taken off both ends of a title: markup models add. */
static int is_wrapper(unsigned char c)
{
    return is_blank(c) || c == '"' || c == '\'' || c == '*' || c == '#' ||
           c == '`' || c == '_';
}

size_t loom__title_clean(char *dst, size_t cap, const char *text)
{
    const char *s = text ? text : "", *end;
    size_t n = 0, max = cap - 1 < LOOM_TITLE_MAX ? cap - 1 : LOOM_TITLE_MAX;
    int space = 0;

    /* The first line with something on it. */
    while (*s == '\n' || *s == '\r' || is_blank((unsigned char)*s))
        s++;
    end = s + strcspn(s, "\r\n");
    while (s < end && is_wrapper((unsigned char)*s))
        s++;
    if ((size_t)(end - s) >= 6 && strncasecmp(s, "title:", 6) == 0)
        for (s += 6; s < end && is_wrapper((unsigned char)*s); s++)
            ;
    while (end > s && is_wrapper((unsigned char)end[-1]))
        end--;
    for (; s < end && n < cap - 1; s++) {
        if (is_blank((unsigned char)*s)) {
            space = 1;
            continue;
        }
        if (space && n)
            dst[n++] = ' ';
        space = 0;
        if (n < cap - 1)
            dst[n++] = *s;
    }
    n = loom__utf8_cut(dst, n, max);
    /* A cut may leave a space at the end. */
    while (n && dst[n - 1] == ' ')
        n--;
    dst[n] = '\0';
    return n;
}

static int on_title_event(const loom_llm_event *ev, void *payload)
{
    (void)ev;
    return payload ? loom_cancel_is_set((loom_cancel *)payload) : 0;
}

/* "label:\n" and text cut to LOOM_TITLE_INPUT_MAX on a character. */
static int put_part(loom_buf *b, const char *label, const char *text)
{
    size_t len = text ? strlen(text) : 0;

    len = loom__utf8_cut(text, len, LOOM_TITLE_INPUT_MAX);
    if (loom_buf_puts(b, label) != 0 ||
        loom_buf_put(b, text ? text : "", len) != 0 ||
        loom_buf_puts(b, "\n\n") != 0)
        return loom__error_oom();
    return 0;
}

int loom__title_run(loom__title_outcome *out, const loom__gate *gate,
                    loom_provider *provider, const char *model,
                    const char *user, const char *answer, loom_cancel *cancel)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    loom_message m[2];
    /* Two parts of at most LOOM_TITLE_INPUT_MAX bytes and their labels. */
    loom_buf b = LOOM_BUF_INIT(2 * LOOM_TITLE_INPUT_MAX + 64);
    char title[LOOM_TITLE_MAX * 2];
    int rc;

    memset(out, 0, sizeof(*out));
    memset(&resp, 0, sizeof(resp));
    if ((rc = put_part(&b, "User:\n", user)) != 0 ||
        (rc = put_part(&b, "Assistant:\n", answer)) != 0)
        goto cleanup;
    memset(m, 0, sizeof(m));
    m[0].role = LOOM_ROLE_SYSTEM;
    m[0].content = (char *)LOOM_TITLE_PROMPT;
    m[1].role = LOOM_ROLE_USER;
    m[1].content = b.ptr;
    req.model = model;
    req.messages = m;
    req.messages_len = 2;
    req.max_tokens = LOOM_TITLE_MAX_TOKENS;
    req.stream = 0;
    rc = provider && model
             ? loom__gated_complete(gate, provider, &req, on_title_event,
                                    cancel, &resp, cancel)
             : LOOM_EINVALID;
    out->usage = resp.usage;
    out->cost_known = resp.cost_known;
    if (rc == LOOM_ECANCELED || (cancel && loom_cancel_is_set(cancel))) {
        rc = loom__error_set(LOOM_ECANCELED, "cancelled while titling");
        goto cleanup;
    }
    if (resp.model && !(out->model = strdup(resp.model))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if (rc == 0 && loom__title_clean(title, sizeof(title), resp.text) > 0 &&
        !(out->title = strdup(title)))
        rc = loom__error_oom();
    else if (rc != LOOM_ENOMEM)
        rc = 0;
cleanup:
    loom_buf_free(&b);
    loom_llm_response_clear(&resp);
    return rc;
}
