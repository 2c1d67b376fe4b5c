/*
 * The automatic review of a run's progress (see review.h and
 * docs/review.md).
 *
 * The reviewer never sees the run's messages as they are: it gets one
 * plain-text transcript, so the call is the same small request whatever
 * the provider (no tool blocks, no provider state), and its size is
 * bounded whatever the run did. Its answer is read leniently, because
 * models wrap JSON in fences and prose, but strictly typed: a review that
 * cannot be trusted is skipped, never guessed at.
 */
#include "agent/review.h"
#include "agent/gate.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"
#include "loom/log.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

const char LOOM_REVIEW_PROMPT[] =
    "You review the progress of an AI assistant that is working on a "
    "user's request with tools. You are given the request and what the "
    "assistant has done so far: its tool calls and excerpts of their "
    "results. Judge whether the information gathered is enough to answer "
    "the request completely and correctly, what is still missing, and what "
    "the assistant should do next.\n\n"
    "Answer with one JSON object and nothing else, in this shape:\n"
    "{\"complete\": true or false, \"gaps\": [\"what is still missing\"], "
    "\"next_step\": \"proceed\" or \"gather_more\" or \"replan\", "
    "\"note\": \"advice for the assistant's next step\"}\n\n"
    "next_step: \"proceed\" when the current approach is working (or the "
    "request can be answered now); \"gather_more\" when more information "
    "is needed from the tools; \"replan\" when the approach is not working "
    "and must change. At most 5 gaps, each a few words; the note under 60 "
    "words.";

/* Room kept in a transcript for the line that counts left-out steps. */
#define LEFT_OUT_LINE 64

/* ---- text helpers -------------------------------------------------------- */

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/*
 * Appends s with every whitespace run shown as one space and the ends
 * trimmed, at most max bytes of it; a longer text is cut on a character
 * and ends in "..." (within max). Reads only as far as it needs, so a
 * large tool result costs little.
 */
static int put_excerpt(loom_buf *b, const char *s, size_t max)
{
    size_t start = b->len, keep;
    int space = 0, rc = 0;

    s = s ? s : "";
    while (*s && is_space(*s))
        s++;
    for (; *s && !rc; s++) {
        if (is_space(*s)) {
            space = 1;
            continue;
        }
        if (b->len - start + space + 1 > max)
            break;
        if (space)
            rc = loom_buf_putc(b, ' ');
        space = 0;
        if (!rc)
            rc = loom_buf_putc(b, *s);
    }
    if (rc || !*s)
        return rc;
    /* Past max: the head that leaves room for "...", on a character.
     * The byte after the head is there, as at least max - 1 are. */
    keep = b->ptr ? loom__utf8_cut(b->ptr + start, b->len - start,
                                   max > 3 ? max - 3 : 0)
                  : 0;
    b->len = start + keep;
    if (b->ptr)
        b->ptr[b->len] = '\0';
    return loom_buf_puts(b, max >= 3 ? "..." : "");
}

/* A copy of s cut to max bytes (with "..." in them when cut), *cut set. */
static char *dup_cut(const char *s, size_t max, int *cut)
{
    size_t len = strlen(s), keep;
    char *p;

    *cut = len > max;
    if (!*cut)
        return strdup(s);
    keep = loom__utf8_cut(s, len, max - 3);
    if (!(p = malloc(keep + 4)))
        return NULL;
    memcpy(p, s, keep);
    memcpy(p + keep, "...", 4);
    return p;
}

/* ---- the transcript ------------------------------------------------------ */

/* Renders one message of the steps into *out (NULL when it shows none). */
static int render_step(char **out, const loom_message *m)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    int rc = 0;

    *out = NULL;
    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        if (m->content && *m->content &&
            ((rc = loom_buf_puts(&b, "- The assistant wrote: ")) != 0 ||
             (rc = put_excerpt(&b, m->content, LOOM_REVIEW_TEXT_MAX)) != 0 ||
             (rc = loom_buf_putc(&b, '\n')) != 0))
            break;
        for (size_t i = 0; i < m->tool_calls_len && !rc; i++) {
            const loom_tool_call *c = &m->tool_calls[i];
            if (!(rc = loom_buf_printf(&b, "- It called %s with ",
                                       c->name ? c->name : "a tool")) &&
                !(rc = put_excerpt(&b, c->arguments ? c->arguments : "{}",
                                   LOOM_REVIEW_ARGS_MAX)))
                rc = loom_buf_putc(&b, '\n');
        }
        break;
    case LOOM_ROLE_TOOL: {
        size_t len = m->content ? strlen(m->content) : 0;
        if (!(rc = loom_buf_printf(&b, "- Result of %s (%zu bytes): ",
                                   m->name ? m->name : "a tool", len)) &&
            !(rc = put_excerpt(&b, m->content, LOOM_REVIEW_RESULT_MAX)))
            rc = loom_buf_putc(&b, '\n');
        break;
    }
    default: /* the user's earlier words, loom's own system notes */
        break;
    }
    if (!rc && b.len && !(*out = loom_buf_detach(&b)))
        rc = loom__error_oom();
    loom_buf_free(&b);
    return rc;
}

int loom__review_transcript(char **out, const loom_message *msgs, size_t n,
                            size_t max)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char **steps = NULL;
    size_t user = n, nsteps = 0, first, used, goal_max;
    int rc = 0;

    *out = NULL;
    if (!max)
        max = LOOM_REVIEW_DEFAULT_MAX_TRANSCRIPT;
    for (size_t i = n; i-- > 0;)
        if (msgs[i].role == LOOM_ROLE_USER) {
            user = i;
            break;
        }
    /* The request takes at most a quarter of a small transcript. */
    goal_max = max / 4 < LOOM_REVIEW_GOAL_MAX ? max / 4
                                               : LOOM_REVIEW_GOAL_MAX;
    if ((rc = loom_buf_puts(&b, "The user's request:\n")) != 0)
        goto cleanup;
    if (user < n && msgs[user].content && *msgs[user].content) {
        int cut;
        char *g = dup_cut(msgs[user].content, goal_max, &cut);
        if (!g) {
            rc = loom__error_oom();
            goto cleanup;
        }
        rc = loom_buf_puts(&b, g);
        free(g);
    } else {
        rc = loom_buf_puts(&b, "(none)");
    }
    if (rc || (rc = loom_buf_puts(&b, "\n\nWhat the assistant has done so "
                                      "far:\n")) != 0)
        goto cleanup;
    if (n > user + 1 && !(steps = calloc(n - user - 1, sizeof(*steps)))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = user + 1; i < n; i++) {
        if ((rc = render_step(&steps[nsteps], &msgs[i])) != 0)
            goto cleanup;
        if (steps[nsteps])
            nsteps++;
    }
    if (!nsteps) {
        rc = loom_buf_puts(&b, "nothing yet.\n");
        goto cleanup;
    }
    /* The newest steps that fit, with room for the left-out line. */
    used = b.len + LEFT_OUT_LINE;
    for (first = nsteps; first > 0; first--) {
        size_t l = strlen(steps[first - 1]);
        if (used + l > max)
            break;
        used += l;
    }
    if (first && (rc = loom_buf_printf(&b, "(%zu earlier step%s left out)\n",
                                       first, first == 1 ? "" : "s")) != 0)
        goto cleanup;
    for (size_t i = first; i < nsteps && !rc; i++)
        rc = loom_buf_puts(&b, steps[i]);
cleanup:
    for (size_t i = 0; i < nsteps; i++)
        free(steps[i]);
    free(steps);
    if (!rc) {
        /* A limit too small even for the request: the head. */
        b.len = loom__utf8_cut(b.ptr, b.len, max);
        b.ptr[b.len] = '\0';
        if (!(*out = loom_buf_detach(&b)))
            rc = loom__error_oom();
    }
    loom_buf_free(&b);
    return rc;
}

/* ---- the answer ---------------------------------------------------------- */

const char *loom__review_step_name(loom__review_step step)
{
    switch (step) {
    case LOOM__REVIEW_GATHER_MORE: return "gather_more";
    case LOOM__REVIEW_REPLAN: return "replan";
    default: return "proceed";
    }
}

void loom__review_clear(loom__review *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->gaps_len; i++)
        free(r->gaps[i]);
    free(r->gaps);
    free(r->note);
    memset(r, 0, sizeof(*r));
}

/* Reads next_step leniently: case, blanks, and `-` or space for `_`. */
static int read_step(const char *s, loom__review_step *step)
{
    static const char *const names[] = {"proceed", "gather_more", "replan"};
    char v[32];
    size_t n = 0;

    while (*s && is_space(*s))
        s++;
    for (; *s && n < sizeof(v) - 1; s++)
        v[n++] = *s == '-' || *s == ' ' ? '_'
                                        : (char)tolower((unsigned char)*s);
    if (*s)
        return -1;
    while (n > 0 && v[n - 1] == '_')
        n--;
    v[n] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(v, names[i]) == 0) {
            *step = (loom__review_step)i;
            return 0;
        }
    return -1;
}

/* Checks and copies the members of a review object. */
static int take_review(loom__review *r, const json_t *o)
{
    const json_t *complete = json_object_get(o, "complete");
    const json_t *gaps = json_object_get(o, "gaps");
    const json_t *step = json_object_get(o, "next_step");
    const json_t *note = json_object_get(o, "note");
    size_t i, keep;
    const json_t *g;

    if (!json_is_boolean(complete))
        return loom__error_set(LOOM_EPROTO, "the review's \"complete\" is "
                                            "missing or not true or false");
    if (!json_is_string(step) ||
        read_step(json_string_value(step), &r->next_step) != 0)
        return loom__error_set(LOOM_EPROTO,
                               "the review's \"next_step\" is missing or not "
                               "\"proceed\", \"gather_more\" or \"replan\"");
    if (!json_is_string(note))
        return loom__error_set(LOOM_EPROTO, "the review's \"note\" is "
                                            "missing or not a string");
    if (gaps && !json_is_null(gaps)) {
        if (!json_is_array(gaps))
            return loom__error_set(LOOM_EPROTO, "the review's \"gaps\" is "
                                                "not an array of strings");
        json_array_foreach(gaps, i, g)
            if (!json_is_string(g))
                return loom__error_set(LOOM_EPROTO,
                                       "the review's \"gaps\" is not an "
                                       "array of strings");
    }
    r->complete = json_is_true(complete);
    if (!(r->note = dup_cut(json_string_value(note), LOOM_REVIEW_NOTE_MAX,
                            &r->note_cut)))
        return loom__error_oom();
    keep = json_array_size(gaps) < LOOM_REVIEW_GAPS_MAX
               ? json_array_size(gaps)
               : LOOM_REVIEW_GAPS_MAX;
    r->gaps_dropped = json_array_size(gaps) - keep;
    if (keep && !(r->gaps = calloc(keep, sizeof(*r->gaps))))
        return loom__error_oom();
    for (i = 0; i < keep; i++) {
        int cut;
        r->gaps[i] = dup_cut(json_string_value(json_array_get(gaps, i)),
                             LOOM_REVIEW_GAP_MAX, &cut);
        if (!r->gaps[i])
            return loom__error_oom();
        r->gaps_len++;
    }
    return 0;
}

int loom__review_parse(loom__review *out, const char *text, size_t len)
{
    json_t *o = NULL;
    size_t at = 0;
    int rc, tries = 0;

    memset(out, 0, sizeof(out[0]));
    text = text ? text : "";
    /* The first `{` from which an object parses: bare JSON, JSON in a
     * fence, or JSON in prose. Parsing stops at the object's end. */
    while (!o && tries < LOOM_REVIEW_PARSE_ATTEMPTS) {
        const char *p = memchr(text + at, '{', len - at);
        if (!p)
            break;
        at = (size_t)(p - text);
        tries++;
        o = json_loadb(p, len - at, JSON_DISABLE_EOF_CHECK, NULL);
        if (o && !json_is_object(o)) {
            json_decref(o);
            o = NULL;
        }
        at++;
    }
    if (!o)
        return loom__error_set(LOOM_EPROTO,
                               "the review holds no JSON object");
    rc = take_review(out, o);
    json_decref(o);
    if (rc)
        loom__review_clear(out);
    return rc;
}

int loom__review_note(char **out, const loom__review *r)
{
    static const char *const advice[] = {
        ("continue with the current approach, or answer if you have "
         "what you need"),
        "gather more information with your tools before you answer",
        "change your approach: the current one is not working"};
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    int rc;

    *out = NULL;
    rc = loom_buf_printf(
        &b,
        "[Automatic review of the work so far, written by a reviewer "
        "model, not by the user]\n"
        "Request fully answered: %s\n"
        "Suggested next step: %s (%s)\n",
        r->complete ? "yes" : "no", loom__review_step_name(r->next_step),
        advice[r->next_step <= LOOM__REVIEW_REPLAN ? r->next_step : 0]);
    if (!rc && r->gaps_len)
        rc = loom_buf_puts(&b, "Gaps:\n");
    for (size_t i = 0; !rc && i < r->gaps_len; i++)
        rc = loom_buf_printf(&b, "- %s\n", r->gaps[i]);
    if (!rc && r->note && *r->note)
        rc = loom_buf_printf(&b, "Note: %s\n", r->note);
    if (!rc) {
        b.ptr[--b.len] = '\0';
        if (!(*out = loom_buf_detach(&b)))
            rc = loom__error_oom();
    }
    loom_buf_free(&b);
    return rc;
}

/* ---- the call ------------------------------------------------------------ */

void loom__review_outcome_clear(loom__review_outcome *o)
{
    if (!o)
        return;
    loom__review_clear(&o->review);
    free(o->reason);
    free(o->answer);
    free(o->model);
    memset(o, 0, sizeof(*o));
}

static int on_review_event(const loom_llm_event *ev, void *payload)
{
    (void)ev;
    return payload ? loom_cancel_is_set((loom_cancel *)payload) : 0;
}

/* Makes s fit for a JSON event: when it is not valid UTF-8 (an
 * upstream's error text may not be), every non-ASCII byte becomes '?'. */
static void ascii_if_invalid(char *s)
{
    json_t *j = json_string(s);

    if (j) {
        json_decref(j);
        return;
    }
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80)
            *s = '?';
}

/* Marks the outcome skipped; the reason is head and detail joined. */
static int skip(loom__review_outcome *o, const char *answer, size_t len,
                const char *head, const char *detail)
{
    if (asprintf(&o->reason, "%s%s", head, detail) < 0) {
        o->reason = NULL;
        return loom__error_oom();
    }
    ascii_if_invalid(o->reason);
    if (answer && len) {
        size_t keep = loom__utf8_cut(answer, len, LOOM_REVIEW_EXCERPT_MAX);
        if (!(o->answer = strndup(answer, keep)))
            return loom__error_oom();
        ascii_if_invalid(o->answer);
    }
    loom_warn("review: skipped: %s", o->reason);
    return 0;
}

int loom__review_run(loom__review_outcome *out,
                     const loom__review_options *opts,
                     const loom_message *msgs, size_t n,
                     loom_cancel *cancel)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    loom_message m[2];
    char *transcript = NULL, *why = NULL;
    size_t max_answer, len;
    const char *text;
    int rc;

    memset(out, 0, sizeof(*out));
    memset(&resp, 0, sizeof(resp));
    if (!opts || !opts->provider || !opts->model || !*opts->model)
        return loom__error_set(LOOM_EINVALID,
                               "review: a provider and a model are "
                               "required");
    max_answer = opts->max_answer ? opts->max_answer
                                  : LOOM_REVIEW_DEFAULT_MAX_ANSWER;
    if ((rc = loom__review_transcript(&transcript, msgs, n,
                                      opts->max_transcript)) != 0)
        goto cleanup;
    memset(m, 0, sizeof(m));
    m[0].role = LOOM_ROLE_SYSTEM;
    m[0].content = (char *)(opts->prompt ? opts->prompt : LOOM_REVIEW_PROMPT);
    m[1].role = LOOM_ROLE_USER;
    m[1].content = transcript;
    req.model = opts->model;
    req.messages = m;
    req.messages_len = 2;
    req.max_tokens = opts->max_tokens > 0 ? opts->max_tokens
                                          : LOOM_REVIEW_DEFAULT_MAX_TOKENS;
    req.stream = 0;
    rc = loom__gated_complete(opts->gate, opts->provider, &req, on_review_event,
                              cancel, &resp, cancel);
    out->usage = resp.usage;
    out->cost_known = resp.cost_known;
    if (resp.model && !(out->model = strdup(resp.model))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if (rc == LOOM_ECANCELED || (cancel && loom_cancel_is_set(cancel))) {
        rc = loom__error_set(LOOM_ECANCELED, "cancelled while reviewing");
        goto cleanup;
    }
    if (rc == LOOM_ENOMEM)
        goto cleanup;
    if (rc) {
        rc = skip(out, NULL, 0, "the review call failed: ",
                  resp.error.message ? resp.error.message
                                     : loom_error_last());
        goto cleanup;
    }
    text = resp.text ? resp.text : "";
    len = strlen(text);
    if (strspn(text, " \t\r\n") == len) {
        rc = skip(out, NULL, 0, "the reviewer returned no text", "");
        goto cleanup;
    }
    if (len > max_answer) {
        char lim[64];
        snprintf(lim, sizeof(lim), "%zu bytes, more than %zu", len,
                 max_answer);
        rc = skip(out, text, len, "the review answer is ", lim);
        goto cleanup;
    }
    rc = loom__review_parse(&out->review, text, len);
    if (rc == LOOM_EPROTO) {
        /* The parser's message, before another call replaces it. */
        if (!(why = strdup(loom_error_last()))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        rc = skip(out, text, len, why, "");
        goto cleanup;
    }
    if (rc == 0)
        out->ok = 1;
cleanup:
    free(why);
    free(transcript);
    loom_llm_response_clear(&resp);
    return rc;
}

/* ---- the event ----------------------------------------------------------- */

json_t *loom__review_event_json(const loom__review_outcome *o, int iteration)
{
    json_t *d = json_object(), *u = json_object(), *gaps = NULL;
    int bad = !d || !u;

    if (!bad) {
        bad |= json_object_set_new(u, "prompt_tokens",
                                   json_integer(o->usage.prompt_tokens));
        bad |= json_object_set_new(
            u, "completion_tokens", json_integer(o->usage.completion_tokens));
        bad |= json_object_set_new(u, "total_tokens",
                                   json_integer(o->usage.total_tokens));
        if (o->cost_known)
            bad |= json_object_set_new(u, "cost_micros",
                                       json_integer(o->usage.cost_micros));
        bad |= json_object_set_new(d, "iteration", json_integer(iteration));
        bad |= json_object_set_new(d, "status",
                                   json_string(o->ok ? "ok" : "skipped"));
    }
    if (!bad && o->ok) {
        const loom__review *r = &o->review;
        bad |= json_object_set_new(d, "complete", json_boolean(r->complete));
        bad |= json_object_set_new(
            d, "next_step", json_string(loom__review_step_name(r->next_step)));
        bad |= !(gaps = json_array());
        for (size_t i = 0; !bad && i < r->gaps_len; i++)
            bad |= json_array_append_new(gaps, json_string(r->gaps[i]));
        if (!bad) {
            bad |= json_object_set_new(d, "gaps", gaps);
            gaps = NULL;
        }
        if (!bad && r->gaps_dropped)
            bad |= json_object_set_new(
                d, "gaps_dropped", json_integer((json_int_t)r->gaps_dropped));
        bad |= json_object_set_new(d, "note",
                                   json_string(r->note ? r->note : ""));
        if (!bad && r->note_cut)
            bad |= json_object_set_new(d, "note_cut", json_true());
    } else if (!bad) {
        bad |= json_object_set_new(d, "reason",
                                   json_string(o->reason ? o->reason : ""));
        if (o->answer)
            bad |= json_object_set_new(d, "answer", json_string(o->answer));
    }
    if (!bad && o->model)
        bad |= json_object_set_new(d, "model", json_string(o->model));
    if (!bad) {
        bad |= json_object_set_new(d, "usage", u);
        u = NULL;
    }
    json_decref(gaps);
    json_decref(u);
    if (bad) {
        json_decref(d);
        return NULL;
    }
    return d;
}
