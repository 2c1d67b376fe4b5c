/*
 * The context engine (see include/loom/context.h and docs/context.md).
 *
 * The engine sees the whole conversation at every model call and never
 * changes it; it decides, message by message, how each is shown (as is,
 * cut, reduced) or whether it is left out (dropped, or stood for by the
 * summary), and hands back an array of shallow copies whose strings are
 * borrowed from the conversation or owned by the engine.
 *
 * Why it is shaped so:
 * - Counting is the expensive part (a real tokenizer), so counts live in
 *   a per-position cache with a cheap fingerprint; a run only appends, so
 *   every message is counted once. The per-call work is a few linear
 *   passes over small arrays.
 * - Strings the engine makes (cuts, reduced results, the summary) stay at
 *   one address while they are in use, and one that is replaced is freed
 *   only at the fit after next: the request-text cache of the adapters
 *   (loom_llm_cache) recognises messages by their pointers, so a new
 *   string must never reuse the address of one the previous request
 *   carried.
 * - Units keep an assistant tool call with its results: every drop and
 *   the summary's boundary fall between units, never inside one.
 */
#include "loom/context.h"
#include "agent/gate.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"
#include "loom/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SHARE 0.5
#define DEFAULT_REDUCED_BYTES 600
#define DEFAULT_MAX_OUTPUT_CAP 4096
#define DEFAULT_SUMMARY_CAP 1024
#define MIN_MARGIN 16
/* The least a cut user message may keep (its marker alone is ~25). */
#define MIN_USER_TOKENS 64
/* Bytes of the content's head and tail hashed into a fingerprint. */
#define SAMPLE_BYTES 32
/* Attempts to cut a text to a token count before giving up. */
#define CUT_ATTEMPTS 16
/* Per message of a summary transcript: its label and spacing. */
#define TRANSCRIPT_OVERHEAD 8

#define SUMMARY_HEADER                                                       \
    "Summary of the earlier conversation, condensed to fit the context "    \
    "window:\n\n"

/* How a message is shown when it is in the request. */
enum { SHOW_FULL = 0, SHOW_CUT, SHOW_REDUCED };
/* Why a message is not in the request. */
enum { IN = 0, GONE_SUMMARISED, GONE_TURN, GONE_ROUND };

typedef struct {
    /* Fingerprint of the message the counts were made for. */
    int valid;
    loom_role role;
    const char *content, *call_id, *name, *pstate, *summary;
    const loom_tool_call *calls;
    size_t ncalls, content_len;
    uint64_t sample;
    size_t tokens; /* the message as given */
    /* content cut to fit cut_limit tokens (tool results, user message) */
    char *cut;
    size_t cut_limit, cut_tokens;
    /* the reduced form of a tool result; NULL when not smaller */
    char *reduced;
    size_t reduced_tokens;
    int reduced_done;
} entry;

struct loom_context {
    loom_context_options o; /* strings below are owned copies */
    char *prompt;
    long window, max_output, margin;
    size_t limit;
    size_t counted;
    entry *e;
    size_t ne, cape;
    /* per fit */
    unsigned char *show, *gone, *pinned;
    size_t *unit_end; /* at a unit's first index: one past its end */
    size_t capf;
    loom_message *out;
    size_t capout;
    loom_context_cut *cuts;
    size_t ncuts, capcuts;
    /* tools count */
    const loom_tool_def *tools;
    size_t ntools, tools_tokens;
    int tools_valid;
    /* the summary: owned message content, its count and coverage */
    char *summary;
    size_t summary_tokens, summary_covers;
    char *summary_error;
    /* what the summary call asks first (gate.h); NULL: nothing */
    const loom__gate *gate;
    /* strings replaced since the last fit began, freed at the next */
    char **retired;
    size_t nretired, capretired;
};

/* ---- counting ------------------------------------------------------------ */

static size_t quarter(const char *s)
{
    return s ? (strlen(s) + 3) / 4 : 0;
}

size_t loom_context_count_message(const loom_message *m, void *payload)
{
    size_t t = 4;

    (void)payload;
    t += quarter(m->content) + quarter(m->provider_state) +
         quarter(m->tool_call_id) + quarter(m->name);
    for (size_t i = 0; i < m->tool_calls_len; i++)
        t += 4 + quarter(m->tool_calls[i].id) +
             quarter(m->tool_calls[i].name) +
             quarter(m->tool_calls[i].arguments);
    return t;
}

size_t loom_context_count_tools(const loom_tool_def *tools, size_t n,
                                void *payload)
{
    size_t t = 0;

    (void)payload;
    for (size_t i = 0; i < n; i++) {
        t += 8 + quarter(tools[i].name) + quarter(tools[i].description);
        if (tools[i].parameters) {
            char *s = json_dumps(tools[i].parameters, JSON_COMPACT);
            t += quarter(s);
            free(s);
        }
    }
    return t;
}

static size_t count_msg(loom_context *ctx, const loom_message *m)
{
    ctx->counted++;
    return ctx->o.counter.message
               ? ctx->o.counter.message(m, ctx->o.counter.payload)
               : loom_context_count_message(m, NULL);
}

static size_t count_tools(loom_context *ctx, const loom_tool_def *t,
                          size_t n)
{
    if (!n)
        return 0;
    return ctx->o.counter.tools
               ? ctx->o.counter.tools(t, n, ctx->o.counter.payload)
               : loom_context_count_tools(t, n, NULL);
}

const char *loom_context_summary(const loom_context *ctx, size_t *covers)
{
    if (covers)
        *covers = ctx && ctx->summary ? ctx->summary_covers : 0;
    return ctx && ctx->summary ? ctx->summary + strlen(SUMMARY_HEADER)
                               : NULL;
}

void loom__context_set_gate(loom_context *ctx, const loom__gate *gate)
{
    ctx->gate = gate;
}

size_t loom_context_counted(const loom_context *ctx)
{
    return ctx ? ctx->counted : 0;
}

/*
 * A hash of the head and the tail of s (32 bytes each), 8 bytes at a
 * time: this runs for every message at every fit, so it must stay far
 * below the cost of reading the whole string.
 */
static uint64_t sample_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL ^ len, w;

    if (len < 16) {
        for (size_t i = 0; i < len; i++)
            h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
        return h;
    }
    for (size_t i = 0; i + 8 <= SAMPLE_BYTES && i + 8 <= len; i += 8) {
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (size_t i = 0; i + 8 <= SAMPLE_BYTES && i + 8 <= len; i += 8) {
        memcpy(&w, s + len - 8 - i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    return h;
}

/* ---- owned strings ------------------------------------------------------- */

static int push_ptr(char ***v, size_t *n, size_t *cap, char *p)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        char **q = realloc(*v, c * sizeof(*q));
        if (!q)
            return loom__error_oom();
        *v = q;
        *cap = c;
    }
    (*v)[(*n)++] = p;
    return 0;
}

/*
 * Hands a string the previous request may have carried to the retired
 * list, freed when the next fit begins: by then the adapter cache only
 * remembers the request made from this fit, which does not carry it, so
 * its address may be reused. Out of memory, it is freed now: the worst
 * case is a wrong cache hit on a reused address, so the list is tried
 * first.
 */
static void retire(loom_context *ctx, char *p)
{
    if (p && push_ptr(&ctx->retired, &ctx->nretired, &ctx->capretired, p))
        free(p);
}

static void free_retired(loom_context *ctx)
{
    for (size_t i = 0; i < ctx->nretired; i++)
        free(ctx->retired[i]);
    ctx->nretired = 0;
}

static void entry_forget(loom_context *ctx, entry *e)
{
    retire(ctx, e->cut);
    retire(ctx, e->reduced);
    memset(e, 0, sizeof(*e));
}

/* ---- set-up -------------------------------------------------------------- */

static int limits(long *max_out, long *margin, size_t *limit, long window,
                  long max_output, long margin_in)
{
    long mo = max_output, mg = margin_in;

    if (window <= 0)
        return loom__error_set(LOOM_EINVALID,
                               "context: the window must be above 0 tokens");
    if (mo <= 0)
        mo = window / 4 < DEFAULT_MAX_OUTPUT_CAP ? window / 4
                                                 : DEFAULT_MAX_OUTPUT_CAP;
    if (mg <= 0)
        mg = window / 50 > MIN_MARGIN ? window / 50 : MIN_MARGIN;
    if (mo >= window || mg >= window - mo)
        return loom__error_set(LOOM_EINVALID,
                               "context: a window of %ld tokens leaves no "
                               "room for the request after %ld of output "
                               "and a margin of %ld",
                               window, mo, mg);
    *max_out = mo;
    *margin = mg;
    *limit = (size_t)(window - mo - mg);
    return 0;
}

int loom_context_new(loom_context **out, const loom_context_options *opts)
{
    loom_context *ctx;
    long mo = 0, mg = 0;
    size_t limit = 0;
    int rc;

    *out = NULL;
    if (!opts ||
        (opts->version != LOOM_CONTEXT_OPTIONS_VERSION && opts->version != 0))
        return loom__error_set(LOOM_EINVALID, "context options: bad version");
    if (opts->tool_result_share < 0 || opts->tool_result_share > 1)
        return loom__error_set(LOOM_EINVALID,
                               "context: tool_result_share must be in "
                               "(0, 1]");
    if ((rc = limits(&mo, &mg, &limit, opts->context_window,
                     opts->max_output_tokens, opts->margin)) != 0)
        return rc;
    if (!(ctx = calloc(1, sizeof(*ctx))))
        return loom__error_oom();
    ctx->o = *opts;
    ctx->o.summary = NULL;
    ctx->window = opts->context_window;
    ctx->max_output = mo;
    ctx->margin = mg;
    ctx->limit = limit;
    if (ctx->o.tool_result_share == 0)
        ctx->o.tool_result_share = DEFAULT_SHARE;
    if (ctx->o.reduced_result_bytes == 0)
        ctx->o.reduced_result_bytes = DEFAULT_REDUCED_BYTES;
    if (!(ctx->prompt = strdup(opts->summary_prompt
                                   ? opts->summary_prompt
                                   : LOOM_CONTEXT_SUMMARY_PROMPT)))
        goto oom;
    ctx->o.summary_prompt = ctx->prompt;
    if (opts->summary && *opts->summary) {
        loom_message m = {0};
        if (asprintf(&ctx->summary, "%s%s", SUMMARY_HEADER, opts->summary) <
            0) {
            ctx->summary = NULL;
            goto oom;
        }
        m.role = LOOM_ROLE_SYSTEM;
        m.content = ctx->summary;
        ctx->summary_tokens = count_msg(ctx, &m);
        ctx->summary_covers = opts->summary_covers;
    }
    *out = ctx;
    return 0;
oom:
    loom_context_free(ctx);
    return loom__error_oom();
}

int loom_context_set_window(loom_context *ctx, long context_window,
                            long max_output_tokens)
{
    long mo = 0, mg = 0;
    size_t limit = 0;
    int rc;

    if ((rc = limits(&mo, &mg, &limit, context_window, max_output_tokens,
                     ctx->o.margin)) != 0)
        return rc;
    ctx->window = context_window;
    ctx->max_output = mo;
    ctx->margin = mg;
    ctx->limit = limit;
    return 0;
}

void loom_context_free(loom_context *ctx)
{
    if (!ctx)
        return;
    for (size_t i = 0; i < ctx->ne; i++) {
        free(ctx->e[i].cut);
        free(ctx->e[i].reduced);
    }
    free(ctx->e);
    free_retired(ctx);
    free(ctx->retired);
    free(ctx->show);
    free(ctx->gone);
    free(ctx->pinned);
    free(ctx->unit_end);
    free(ctx->out);
    free(ctx->cuts);
    free(ctx->prompt);
    free(ctx->summary);
    free(ctx->summary_error);
    free(ctx);
}

const char *loom_context_layout_name(loom_context_layout layout)
{
    switch (layout) {
    case LOOM_CONTEXT_FULL: return "full";
    case LOOM_CONTEXT_REDUCED: return "reduced";
    case LOOM_CONTEXT_TRIMMED: return "trimmed";
    case LOOM_CONTEXT_SUMMARY: return "summary";
    }
    return "unknown";
}

/* ---- per-fit arrays ------------------------------------------------------ */

static int reserve(loom_context *ctx, size_t n)
{
    if (n > ctx->cape) {
        size_t c = ctx->cape ? ctx->cape : 64;
        entry *e;
        while (c < n)
            c *= 2;
        if (!(e = realloc(ctx->e, c * sizeof(*e))))
            return loom__error_oom();
        memset(e + ctx->cape, 0, (c - ctx->cape) * sizeof(*e));
        ctx->e = e;
        ctx->cape = c;
    }
    if (n + 1 > ctx->capf) {
        size_t c = ctx->capf ? ctx->capf : 64;
        void *p;
        while (c < n + 1)
            c *= 2;
        if (!(p = realloc(ctx->show, c)))
            return loom__error_oom();
        ctx->show = p;
        if (!(p = realloc(ctx->gone, c)))
            return loom__error_oom();
        ctx->gone = p;
        if (!(p = realloc(ctx->pinned, c)))
            return loom__error_oom();
        ctx->pinned = p;
        if (!(p = realloc(ctx->unit_end, c * sizeof(size_t))))
            return loom__error_oom();
        ctx->unit_end = p;
        if (!(p = realloc(ctx->out, c * sizeof(loom_message))))
            return loom__error_oom();
        ctx->out = p;
        ctx->capf = c;
    }
    return 0;
}

static int add_cut(loom_context *ctx, const loom_context_cut *c)
{
    if (ctx->ncuts == ctx->capcuts) {
        size_t n = ctx->capcuts ? ctx->capcuts * 2 : 8;
        loom_context_cut *p = realloc(ctx->cuts, n * sizeof(*p));
        if (!p)
            return loom__error_oom();
        ctx->cuts = p;
        ctx->capcuts = n;
    }
    ctx->cuts[ctx->ncuts++] = *c;
    return 0;
}

/* Brings entry i up to msgs[i]: counted again only when it changed. */
static void sync_entry(loom_context *ctx, size_t i, const loom_message *m)
{
    entry *e = &ctx->e[i];
    size_t len = m->content ? strlen(m->content) : 0;
    uint64_t h = m->content ? sample_hash(m->content, len) : 0;

    if (e->valid && e->role == m->role && e->content == m->content &&
        e->content_len == len && e->sample == h && e->calls == m->tool_calls &&
        e->ncalls == m->tool_calls_len && e->call_id == m->tool_call_id &&
        e->name == m->name && e->pstate == m->provider_state &&
        e->summary == m->summary)
        return;
    entry_forget(ctx, e);
    e->valid = 1;
    e->role = m->role;
    e->content = m->content;
    e->content_len = len;
    e->sample = h;
    e->calls = m->tool_calls;
    e->ncalls = m->tool_calls_len;
    e->call_id = m->tool_call_id;
    e->name = m->name;
    e->pstate = m->provider_state;
    e->summary = m->summary;
    e->tokens = count_msg(ctx, m);
}

/* ---- cutting ------------------------------------------------------------- */

/*
 * Makes content for m: the head of its content and a marker saying how
 * much is shown, so that m counts at most limit tokens. The first guess
 * is proportional, and each miss scales down by what the count said, so
 * a real tokenizer is run a few times at most. *tokens gets the count;
 * when even the marker alone is over the limit, the marker is returned
 * and *tokens is above limit. NULL when out of memory.
 */
static char *cut_to(loom_context *ctx, const loom_message *m,
                    size_t full_tokens, size_t limit, const char *what,
                    size_t *tokens)
{
    const char *s = m->content ? m->content : "";
    size_t len = strlen(s), keep;
    loom_message tmp = *m;
    char *t = NULL;

    keep = full_tokens ? (size_t)((double)len * (double)limit /
                                  (double)full_tokens)
                       : len;
    for (int i = 0; i < CUT_ATTEMPTS; i++) {
        size_t n;
        keep = loom__utf8_cut(s, len, keep < len ? keep : len);
        free(t);
        if (asprintf(&t, "%.*s\n[%s cut to fit the context window: %zu of "
                     "%zu bytes shown]",
                     (int)keep, s, what, keep, len) < 0)
            return NULL;
        tmp.content = t;
        n = count_msg(ctx, &tmp);
        *tokens = n;
        if (n <= limit || keep == 0)
            return t;
        keep = (size_t)((double)keep * (double)limit / (double)n * 0.9);
    }
    /* The counter did not follow the text down: show the marker alone. */
    free(t);
    if (asprintf(&t, "[%s cut to fit the context window: 0 of %zu bytes "
                 "shown]", what, len) < 0)
        return NULL;
    tmp.content = t;
    *tokens = count_msg(ctx, &tmp);
    return t;
}

/* Shows entry i cut to limit tokens (made again when the limit moved). */
static int ensure_cut(loom_context *ctx, size_t i, const loom_message *m,
                      size_t limit, const char *what)
{
    entry *e = &ctx->e[i];
    loom_context_cut c;
    char *t;

    if (e->cut && e->cut_limit == limit)
        return 0;
    if (!(t = cut_to(ctx, m, e->tokens, limit, what, &c.tokens_after)))
        return loom__error_oom();
    retire(ctx, e->cut);
    e->cut = t;
    e->cut_limit = limit;
    e->cut_tokens = c.tokens_after;
    c.index = i;
    c.role = m->role;
    c.tool_call_id = m->tool_call_id;
    c.tokens_before = e->tokens;
    c.bytes = e->content_len;
    return add_cut(ctx, &c);
}

/*
 * The reduced form of a tool result: the
 * tool's summary, or the head of the result, with a note, and none of
 * the result's images. Left NULL when it would not be smaller than the
 * result as shown.
 */
static int ensure_reduced(loom_context *ctx, size_t i, const loom_message *m)
{
    entry *e = &ctx->e[i];
    const char *src = m->summary && *m->summary ? m->summary : m->content;
    size_t len = src ? strlen(src) : 0;
    size_t keep = loom__utf8_cut(src ? src : "", len,
                              ctx->o.reduced_result_bytes);
    loom_message tmp = *m;
    char *t;

    if (e->reduced_done)
        return 0;
    if (asprintf(&t, "[Earlier result of %s, reduced to save context (%zu "
                 "bytes in full). %s:]\n%.*s%s",
                 m->name ? m->name : "a tool", e->content_len,
                 src == m->summary ? "Summary" : "Beginning", (int)keep,
                 src ? src : "", keep < len ? "..." : "") < 0)
        return loom__error_oom();
    tmp.content = t;
    tmp.parts = NULL;
    tmp.parts_len = 0;
    e->reduced_tokens = count_msg(ctx, &tmp);
    e->reduced_done = 1;
    if (e->reduced_tokens >= e->tokens) {
        free(t);
        return 0;
    }
    e->reduced = t;
    return 0;
}

/* ---- one fit ------------------------------------------------------------- */

typedef struct {
    const loom_message *m;
    size_t n;
    size_t sys_end;   /* leading system messages */
    size_t user;      /* the current user message, or n */
    size_t round;     /* first index of the newest round after it, or n */
    size_t start;     /* first index after the summary's coverage */
    size_t budget;    /* limit - tools */
    size_t total;     /* tokens of the messages in the request */
    size_t fixed;     /* tokens of the pinned messages */
    int have_summary; /* the summary is in the request */
} fit;

static size_t shown(const loom_context *ctx, size_t i)
{
    const entry *e = &ctx->e[i];

    switch (ctx->show[i]) {
    case SHOW_CUT: return e->cut_tokens;
    case SHOW_REDUCED: return e->reduced_tokens;
    default: return e->tokens;
    }
}

static size_t recount_total(const loom_context *ctx, const fit *f)
{
    size_t t = f->have_summary ? ctx->summary_tokens : 0;

    for (size_t i = 0; i < f->n; i++)
        if (!ctx->gone[i])
            t += shown(ctx, i);
    return t;
}

static int fits(const fit *f)
{
    return f->total <= f->budget;
}

/* Units: an assistant message with tool calls and the tool messages right
 * after it; every other message alone. Pins what is never dropped. */
static void structure(loom_context *ctx, fit *f)
{
    const loom_message *m = f->m;
    size_t n = f->n, i;

    f->sys_end = 0;
    while (f->sys_end < n && m[f->sys_end].role == LOOM_ROLE_SYSTEM)
        f->sys_end++;
    f->user = n;
    for (i = n; i > f->sys_end; i--)
        if (m[i - 1].role == LOOM_ROLE_USER) {
            f->user = i - 1;
            break;
        }
    f->round = n;
    for (i = 0; i < n;) {
        size_t end = i + 1;
        if (m[i].role == LOOM_ROLE_ASSISTANT && m[i].tool_calls_len) {
            while (end < n && m[end].role == LOOM_ROLE_TOOL)
                end++;
            if (i >= f->sys_end && (f->user == n || i > f->user))
                f->round = i;
        }
        ctx->unit_end[i] = end;
        for (size_t j = i + 1; j < end; j++)
            ctx->unit_end[j] = 0;
        i = end;
    }
    for (i = 0; i < n; i++) {
        int p = i < f->sys_end || i == f->user ||
                (f->user < n && i > f->user &&
                 m[i].role == LOOM_ROLE_SYSTEM) ||
                (f->round < n && i >= f->round &&
                 i < ctx->unit_end[f->round]);
        ctx->pinned[i] = (unsigned char)p;
        ctx->show[i] = SHOW_FULL;
        ctx->gone[i] = IN;
    }
}

/* The first index not covered by the summary: after its coverage, never
 * inside a unit. */
static size_t summary_start(const loom_context *ctx, const fit *f)
{
    size_t k;

    if (!ctx->summary)
        return f->sys_end;
    k = f->sys_end + ctx->summary_covers;
    if (k > f->n || k < f->sys_end)
        k = f->n;
    while (k < f->n && !ctx->unit_end[k])
        k++;
    return k;
}

/* Step 1: every tool result over its share of the budget is cut. */
static int cut_tool_results(loom_context *ctx, fit *f)
{
    const loom_message *m = f->m;
    int rc;

    for (size_t i = 0; i < f->n; i++) {
        size_t end = ctx->unit_end[i], first = i + 1, cap;
        if (!end)
            continue;
        /* A tool message without its call (a history cut elsewhere) is
         * a round of its own. */
        if (m[i].role == LOOM_ROLE_TOOL)
            first = i;
        else if (m[i].role != LOOM_ROLE_ASSISTANT || end == i + 1)
            continue;
        cap = (size_t)((double)f->budget * ctx->o.tool_result_share /
                       (double)(end - first));
        for (size_t j = first; j < end; j++) {
            if (ctx->e[j].tokens <= cap)
                continue;
            if ((rc = ensure_cut(ctx, j, &m[j], cap, "tool result")) != 0)
                return rc;
            if (ctx->e[j].cut_tokens < ctx->e[j].tokens)
                ctx->show[j] = SHOW_CUT;
        }
    }
    return 0;
}

static void set_summarised(loom_context *ctx, fit *f)
{
    f->start = summary_start(ctx, f);
    f->have_summary = ctx->summary != NULL;
    for (size_t i = f->sys_end; i < f->n; i++)
        ctx->gone[i] = i < f->start && !ctx->pinned[i] ? GONE_SUMMARISED
                                                        : IN;
}

static size_t pinned_total(const loom_context *ctx, const fit *f)
{
    size_t t = 0;

    for (size_t i = 0; i < f->n; i++)
        if (ctx->pinned[i])
            t += shown(ctx, i);
    return t;
}

/* Step 2: older tool results reduced, oldest first. */
static int reduce_results(loom_context *ctx, fit *f, size_t *reduced)
{
    int rc;

    for (size_t i = f->sys_end; i < f->n && !fits(f); i++) {
        size_t before;
        if (f->m[i].role != LOOM_ROLE_TOOL || ctx->pinned[i] ||
            ctx->gone[i] || ctx->show[i] == SHOW_REDUCED)
            continue;
        if ((rc = ensure_reduced(ctx, i, &f->m[i])) != 0)
            return rc;
        before = shown(ctx, i);
        if (!ctx->e[i].reduced || ctx->e[i].reduced_tokens >= before)
            continue;
        ctx->show[i] = SHOW_REDUCED;
        f->total -= before - ctx->e[i].reduced_tokens;
        (*reduced)++;
    }
    return 0;
}

/* Step 3: whole old turns (from one user message to the next) before
 * the current user message, oldest first. */
static void drop_turns(loom_context *ctx, fit *f, size_t *turns)
{
    size_t t = f->start;

    /* Without a user message everything is the current turn. */
    while (f->user < f->n && t < f->user && !fits(f)) {
        size_t next = t + 1;
        int any = 0;
        while (next < f->user && f->m[next].role != LOOM_ROLE_USER)
            next++;
        for (size_t i = t; i < next; i++) {
            if (ctx->gone[i] || ctx->pinned[i])
                continue;
            ctx->gone[i] = GONE_TURN;
            f->total -= shown(ctx, i);
            any = 1;
        }
        *turns += (size_t)any;
        t = next;
    }
}

/* Step 5: the units of the current turn but the newest round, oldest
 * first. */
static void drop_rounds(loom_context *ctx, fit *f, size_t *rounds)
{
    size_t i = f->user < f->n ? f->user + 1 : f->sys_end;

    if (i < f->start)
        i = f->start;
    while (i < f->n && !fits(f)) {
        size_t end = ctx->unit_end[i] ? ctx->unit_end[i] : i + 1;
        int any = 0;
        for (size_t j = i; j < end; j++) {
            if (ctx->gone[j] || ctx->pinned[j])
                continue;
            ctx->gone[j] = GONE_ROUND;
            f->total -= shown(ctx, j);
            any = 1;
        }
        *rounds += (size_t)any;
        i = end;
    }
}

/* ---- summaries ----------------------------------------------------------- */

static int on_summary_event(const loom_llm_event *ev, void *payload)
{
    (void)ev;
    return payload ? loom_cancel_is_set((loom_cancel *)payload) : 0;
}

/* Appends one message to a summary transcript, as it is shown. */
static int render(loom_buf *b, const loom_context *ctx, size_t i,
                  const loom_message *m)
{
    const char *text = m->content ? m->content : "";
    int rc = 0;

    if (ctx->show[i] == SHOW_CUT && ctx->e[i].cut)
        text = ctx->e[i].cut;
    else if (ctx->show[i] == SHOW_REDUCED && ctx->e[i].reduced)
        text = ctx->e[i].reduced;
    switch (m->role) {
    case LOOM_ROLE_USER:
        rc = loom_buf_printf(b, "User: %s\n\n", text);
        break;
    case LOOM_ROLE_SYSTEM:
        rc = loom_buf_printf(b, "System: %s\n\n", text);
        break;
    case LOOM_ROLE_TOOL:
        rc = loom_buf_printf(b, "Result of %s: %s\n\n",
                             m->name ? m->name : "a tool", text);
        break;
    case LOOM_ROLE_ASSISTANT:
        if (*text)
            rc = loom_buf_printf(b, "Assistant: %s\n", text);
        for (size_t c = 0; !rc && c < m->tool_calls_len; c++)
            rc = loom_buf_printf(
                b, "Assistant called %s with %s\n",
                m->tool_calls[c].name ? m->tool_calls[c].name : "?",
                m->tool_calls[c].arguments ? m->tool_calls[c].arguments
                                           : "{}");
        if (!rc)
            rc = loom_buf_putc(b, '\n');
        break;
    }
    return rc;
}

/*
 * The smallest unit boundary k after the summary's start, up to the
 * newest round, that leaves what follows it (plus the pinned messages
 * and room for the summary) within half the budget, so the next calls
 * have room to grow before the summary needs refreshing; the last
 * boundary when none does. 0 when there is nothing to summarise.
 */
static size_t summary_end(const loom_context *ctx, const fit *f,
                          size_t reserve)
{
    size_t end = f->round < f->n ? f->round : f->n, best = 0;
    size_t rest = 0, i;
    int content = 0;

    /* rest: tokens of the unpinned messages from the boundary on. */
    for (i = f->start; i < f->n; i++)
        if (!ctx->pinned[i])
            rest += shown(ctx, i);
    for (i = f->start; i < end;) {
        size_t u = ctx->unit_end[i] ? ctx->unit_end[i] : i + 1;
        for (size_t j = i; j < u; j++)
            if (!ctx->pinned[j]) {
                rest -= shown(ctx, j);
                content = 1;
            }
        i = u;
        if (!content)
            continue;
        best = i;
        if (f->fixed + reserve + rest <= f->budget / 2)
            break;
    }
    return best;
}

/*
 * The first message the summary model reads of those up to k: it reads
 * at most in_limit tokens (ptok of them its prompt), the newest messages
 * first and older ones while they fit, starting at a whole unit.
 */
static size_t transcript_first(const loom_context *ctx, const fit *f, size_t k,
                               size_t in_limit, size_t ptok)
{
    size_t have =
        ptok + (ctx->summary ? ctx->summary_tokens : 0) + TRANSCRIPT_OVERHEAD;
    size_t first = k;

    for (size_t i = k; i > f->start; i--) {
        size_t t = shown(ctx, i - 1) + TRANSCRIPT_OVERHEAD;
        if (have + t > in_limit)
            break;
        have += t;
        first = i - 1;
    }
    while (first < k && !ctx->unit_end[first])
        first++;
    return first;
}

/*
 * Step 4: asks the summary model for a summary of the old summary and
 * the messages from f->start to k; on success the new summary covers
 * them. A failure is kept in ctx->summary_error and returns 0 with
 * *made 0; only cancellation and memory errors are returned.
 */
static int summarise(loom_context *ctx, fit *f, loom_cancel *cancel,
                     int *made, loom_usage *usage, int *cost_known)
{
    size_t reserve, k, in_limit, first, i, ptok, ttok;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    loom_message msgs[2];
    char *text = NULL, *content = NULL;
    const char *s, *e;
    int rc = 0;

    *made = 0;
    memset(&resp, 0, sizeof(resp));
    memset(msgs, 0, sizeof(msgs));
    reserve = ctx->o.summary_max_tokens > 0
                  ? (size_t)ctx->o.summary_max_tokens
                  : (ctx->limit / 8 < DEFAULT_SUMMARY_CAP
                         ? ctx->limit / 8
                         : DEFAULT_SUMMARY_CAP);
    if (!(k = summary_end(ctx, f, reserve)))
        return 0;
    /* The summary model reads at most the limit less its answer: the
     * newest messages first, older ones while they fit. */
    msgs[0].role = LOOM_ROLE_SYSTEM;
    msgs[0].content = ctx->prompt;
    in_limit = ctx->limit > reserve ? ctx->limit - reserve : 0;
    ptok = count_msg(ctx, &msgs[0]);
    first = transcript_first(ctx, f, k, in_limit, ptok);
    if (ctx->summary &&
        (rc = loom_buf_printf(&b, "Summary so far:\n%s\n\n",
                              ctx->summary + strlen(SUMMARY_HEADER))))
        goto cleanup;
    if ((rc = loom_buf_printf(&b, "%s:\n\n",
                              first > f->start
                                  ? "The conversation that follows it "
                                    "(its oldest part left out)"
                                  : "The conversation")) != 0)
        goto cleanup;
    for (i = first; i < k && !rc; i++)
        rc = render(&b, ctx, i, &f->m[i]);
    if (rc)
        goto cleanup;
    msgs[1].role = LOOM_ROLE_USER;
    msgs[1].content = b.ptr;
    ttok = count_msg(ctx, &msgs[1]);
    if (ttok + ptok > in_limit) {
        /* The estimate per message was short: keep the head. */
        size_t room = in_limit > ptok ? in_limit - ptok : 0;
        if (!(content = cut_to(ctx, &msgs[1], ttok, room, "transcript",
                               &ttok))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        msgs[1].content = content;
    }
    req.model = ctx->o.summary_model;
    req.messages = msgs;
    req.messages_len = 2;
    req.max_tokens = (long)reserve;
    req.stream = 0;
    rc = loom__gated_complete(ctx->gate, ctx->o.summary_provider, &req,
                              on_summary_event, cancel, &resp, cancel);
    *usage = resp.usage;
    *cost_known = resp.cost_known;
    if (rc == LOOM_ECANCELED || (cancel && loom_cancel_is_set(cancel))) {
        rc = loom__error_set(LOOM_ECANCELED, "cancelled while summarising");
        goto cleanup;
    }
    free(ctx->summary_error);
    ctx->summary_error = NULL;
    s = resp.text ? resp.text : "";
    s += strspn(s, " \t\r\n");
    e = s + strlen(s);
    while (e > s && strchr(" \t\r\n", e[-1]))
        e--;
    if (rc != 0 || e == s) {
        const char *why = rc ? (resp.error.message ? resp.error.message
                                                   : loom_error_last())
                             : "the summary model returned no text";
        if (asprintf(&ctx->summary_error, "%s", why) < 0)
            ctx->summary_error = NULL;
        loom_warn("context: summary failed: %s", why);
        rc = 0;
        goto cleanup;
    }
    if (asprintf(&text, "%s%.*s", SUMMARY_HEADER, (int)(e - s), s) < 0) {
        text = NULL;
        rc = loom__error_oom();
        goto cleanup;
    }
    msgs[0].content = text;
    {
        size_t t = count_msg(ctx, &msgs[0]);
        if (t > reserve) {
            /* The model wrote past its allowance: keep what fits. */
            char *c = cut_to(ctx, &msgs[0], t, reserve, "summary", &t);
            if (!c) {
                rc = loom__error_oom();
                goto cleanup;
            }
            free(text);
            text = c;
        }
        retire(ctx, ctx->summary);
        ctx->summary = text;
        ctx->summary_tokens = t;
        text = NULL;
    }
    ctx->summary_covers = k - f->sys_end;
    *made = 1;
cleanup:
    free(text);
    free(content);
    loom_buf_free(&b);
    loom_llm_response_clear(&resp);
    return rc;
}

/* ---- the request --------------------------------------------------------- */

static void build(loom_context *ctx, const fit *f, loom_context_result *r)
{
    size_t k = 0;

    for (size_t i = 0; i < f->n; i++) {
        loom_message *o;
        if (i == f->sys_end && f->have_summary) {
            memset(&ctx->out[k], 0, sizeof(ctx->out[k]));
            ctx->out[k].role = LOOM_ROLE_SYSTEM;
            ctx->out[k++].content = ctx->summary;
        }
        if (ctx->gone[i])
            continue;
        o = &ctx->out[k++];
        *o = f->m[i];
        if (ctx->show[i] == SHOW_CUT) {
            o->content = ctx->e[i].cut;
            r->cut_total++;
        } else if (ctx->show[i] == SHOW_REDUCED) {
            o->content = ctx->e[i].reduced;
            o->parts = NULL;
            o->parts_len = 0;
        }
    }
    if (f->sys_end == f->n && f->have_summary) {
        memset(&ctx->out[k], 0, sizeof(ctx->out[k]));
        ctx->out[k].role = LOOM_ROLE_SYSTEM;
        ctx->out[k++].content = ctx->summary;
    }
    r->messages = ctx->out;
    r->messages_len = k;
}

static int nothing_fits(const loom_context *ctx, const fit *f,
                        size_t user_tokens)
{
    size_t sys = 0, round = 0, tail = 0;

    for (size_t i = 0; i < f->n; i++) {
        if (!ctx->pinned[i] || i == f->user)
            continue;
        if (i < f->sys_end)
            sys += shown(ctx, i);
        else if (f->round < f->n && i >= f->round)
            round += shown(ctx, i);
        else
            tail += shown(ctx, i);
    }
    return loom__error_set(
        LOOM_ETOOLARGE,
        "the request cannot fit the context window: system prompt %zu + "
        "tools %zu + current user message %zu (at least %d when cut) + "
        "newest tool round %zu + later system messages %zu tokens > limit "
        "%zu (window %ld - max output %ld - margin %ld)",
        sys, ctx->tools_tokens, user_tokens, MIN_USER_TOKENS, round, tail,
        ctx->limit, ctx->window, ctx->max_output, ctx->margin);
}

static void log_result(const loom_context_result *r)
{
    if (!loom_log_enabled(LOOM_LOG_DEBUG))
        return;
    loom_debug("context: %s, %zu -> %zu tokens (limit %zu), %zu -> %zu "
               "messages, %zu cut, %zu reduced, %zu turns and %zu rounds "
               "dropped%s%s",
               loom_context_layout_name(r->layout), r->tokens_before,
               r->tokens_after, r->limit, r->messages_before,
               r->messages_len, r->cut_total, r->reduced, r->dropped_turns,
               r->dropped_rounds,
               r->summary_created      ? ", summary made"
               : r->summary_in_request ? ", summary reused"
                                       : "",
               r->user_cut ? ", user message cut" : "");
}

/*
 * Brings the per-message counts up to date with msgs and tools (reused
 * unless a message changed) and fills r's figures from before the fit.
 */
static int count_request(loom_context *ctx, loom_context_result *r,
                         const loom_message *msgs, size_t n,
                         const loom_tool_def *tools, size_t ntools)
{
    int rc;

    free_retired(ctx);
    ctx->ncuts = 0;
    free(ctx->summary_error);
    ctx->summary_error = NULL;
    if ((rc = reserve(ctx, n + 1)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        sync_entry(ctx, i, &msgs[i]);
    for (size_t i = n; i < ctx->ne; i++)
        entry_forget(ctx, &ctx->e[i]);
    ctx->ne = n;
    if (!ctx->tools_valid || ctx->tools != tools || ctx->ntools != ntools) {
        ctx->tools_tokens = count_tools(ctx, tools, ntools);
        ctx->tools = tools;
        ctx->ntools = ntools;
        ctx->tools_valid = 1;
    }
    r->window = ctx->window;
    r->max_output_tokens = ctx->max_output;
    r->margin = ctx->margin;
    r->limit = ctx->limit;
    r->tools_tokens = ctx->tools_tokens;
    r->messages_before = n;
    r->tokens_before = ctx->tools_tokens;
    for (size_t i = 0; i < n; i++)
        r->tokens_before += ctx->e[i].tokens;
    return 0;
}

/* Fills r from the fitted state: the request, its figures, the summary
 * and the layout. */
static void fill_result(loom_context *ctx, const fit *f, loom_context_result *r,
                        int made)
{
    build(ctx, f, r);
    r->tokens_after = f->total + ctx->tools_tokens;
    r->cuts = ctx->cuts;
    r->cuts_len = ctx->ncuts;
    /* Counted from the final state: a new summary resets the drops. */
    r->reduced = 0;
    for (size_t i = 0; i < f->n; i++) {
        r->dropped_messages += ctx->gone[i] != IN;
        r->reduced += !ctx->gone[i] && ctx->show[i] == SHOW_REDUCED;
    }
    if (ctx->summary) {
        r->summary = ctx->summary + strlen(SUMMARY_HEADER);
        r->summary_covers = ctx->summary_covers;
        r->summary_tokens = ctx->summary_tokens;
        r->summary_created = made;
        r->summary_in_request = f->have_summary;
    }
    r->summary_error = ctx->summary_error;
    if (f->have_summary)
        r->layout = LOOM_CONTEXT_SUMMARY;
    else if (r->dropped_turns || r->dropped_rounds)
        r->layout = LOOM_CONTEXT_TRIMMED;
    else if (r->reduced)
        r->layout = LOOM_CONTEXT_REDUCED;
    else
        r->layout = LOOM_CONTEXT_FULL;
}

int loom_context_fit(loom_context *ctx, loom_context_result *r,
                     const loom_message *msgs, size_t n,
                     const loom_tool_def *tools, size_t ntools,
                     loom_cancel *cancel)
{
    fit f;
    size_t user_tokens = 0;
    int rc, made = 0;

    memset(r, 0, sizeof(*r));
    memset(&f, 0, sizeof(f));
    if ((rc = count_request(ctx, r, msgs, n, tools, ntools)) != 0)
        return rc;
    f.m = msgs;
    f.n = n;
    structure(ctx, &f);
    if (f.user < n)
        user_tokens = ctx->e[f.user].tokens;
    if (ctx->tools_tokens + MIN_USER_TOKENS > ctx->limit)
        return nothing_fits(ctx, &f, user_tokens);
    f.budget = ctx->limit - ctx->tools_tokens;
    if ((rc = cut_tool_results(ctx, &f)) != 0)
        return rc;
    set_summarised(ctx, &f);

    /* The pinned parts must fit; the current user message is cut when
     * it alone is too large for what they leave (the
     * USER_MESSAGE_TOO_LARGE warning). */
    f.fixed = pinned_total(ctx, &f);
    if (f.fixed > f.budget) {
        size_t others = f.fixed - user_tokens, room, ncuts = ctx->ncuts;
        if (f.user == n || others + MIN_USER_TOKENS > f.budget ||
            ctx->o.no_user_cut)
            return nothing_fits(ctx, &f, user_tokens);
        room = f.budget - others;
        if ((rc = ensure_cut(ctx, f.user, &msgs[f.user], room, "message")))
            return rc;
        if (ctx->e[f.user].cut_tokens > room)
            return nothing_fits(ctx, &f, user_tokens);
        ctx->show[f.user] = SHOW_CUT;
        r->user_cut = 1;
        r->user_tokens_before = user_tokens;
        r->user_tokens_after = ctx->e[f.user].cut_tokens;
        f.fixed = others + ctx->e[f.user].cut_tokens;
        /* Logged when the cut is made; the event says it every call. */
        if (ctx->ncuts > ncuts)
            loom_warn("context: USER_MESSAGE_TOO_LARGE: the user message "
                      "has %zu tokens, cut to %zu (limit %zu)",
                      user_tokens, r->user_tokens_after, ctx->limit);
    }
    f.total = recount_total(ctx, &f);

    if (!fits(&f) && !ctx->o.keep_full_tool_results &&
        (rc = reduce_results(ctx, &f, &r->reduced)) != 0)
        return rc;
    if (!fits(&f))
        drop_turns(ctx, &f, &r->dropped_turns);
    if (!fits(&f) && ctx->o.summary_provider) {
        if ((rc = summarise(ctx, &f, cancel, &made, &r->summary_usage,
                            &r->summary_cost_known)) != 0)
            return rc;
        if (made) {
            /* The new summary covers the old turns: start again from
             * the shown forms, with no drops. */
            set_summarised(ctx, &f);
            f.fixed = pinned_total(ctx, &f);
            f.total = recount_total(ctx, &f);
            r->dropped_turns = 0;
            if (!fits(&f) && !ctx->o.keep_full_tool_results &&
                (rc = reduce_results(ctx, &f, &r->reduced)) != 0)
                return rc;
            if (!fits(&f))
                drop_turns(ctx, &f, &r->dropped_turns);
        }
    }
    if (!fits(&f))
        drop_rounds(ctx, &f, &r->dropped_rounds);
    if (!fits(&f) && f.have_summary) {
        /* Last resort: the pinned messages alone. */
        f.have_summary = 0;
        f.total -= ctx->summary_tokens;
    }
    if (!fits(&f))
        return nothing_fits(ctx, &f, user_tokens);

    fill_result(ctx, &f, r, made);
    log_result(r);
    return 0;
}

/* ---- the event ----------------------------------------------------------- */

json_t *loom_context_result_json(const loom_context_result *r)
{
    json_t *o = json_object(), *a;
    int bad = !o;

#define SETN(k, v) bad |= !o || json_object_set_new(o, k, v) != 0
    SETN("layout", json_string(loom_context_layout_name(r->layout)));
    SETN("window", json_integer(r->window));
    SETN("max_output_tokens", json_integer(r->max_output_tokens));
    SETN("margin", json_integer(r->margin));
    SETN("limit", json_integer((json_int_t)r->limit));
    SETN("tokens_before", json_integer((json_int_t)r->tokens_before));
    SETN("tokens_after", json_integer((json_int_t)r->tokens_after));
    SETN("tools_tokens", json_integer((json_int_t)r->tools_tokens));
    SETN("messages_before", json_integer((json_int_t)r->messages_before));
    SETN("messages_after", json_integer((json_int_t)r->messages_len));
    SETN("cut", json_integer((json_int_t)r->cut_total));
    SETN("reduced", json_integer((json_int_t)r->reduced));
    SETN("dropped_messages", json_integer((json_int_t)r->dropped_messages));
    SETN("dropped_turns", json_integer((json_int_t)r->dropped_turns));
    SETN("dropped_rounds", json_integer((json_int_t)r->dropped_rounds));
    if (r->cuts_len) {
        a = json_array();
        for (size_t i = 0; a && i < r->cuts_len; i++) {
            const loom_context_cut *c = &r->cuts[i];
            json_t *x = json_pack(
                "{s:I,s:s,s:s?,s:I,s:I,s:I}", "index", (json_int_t)c->index,
                "role", loom_role_name(c->role), "tool_call_id",
                c->tool_call_id, "tokens_before",
                (json_int_t)c->tokens_before, "tokens_after",
                (json_int_t)c->tokens_after, "bytes", (json_int_t)c->bytes);
            bad |= !x || json_array_append_new(a, x) != 0;
        }
        SETN("cuts", a);
    }
    if (r->summary) {
        json_t *s = json_object();
        bad |= !s;
        if (s) {
            json_object_set_new(s, "covers",
                                json_integer((json_int_t)r->summary_covers));
            json_object_set_new(s, "tokens",
                                json_integer((json_int_t)r->summary_tokens));
            json_object_set_new(s, "created",
                                json_boolean(r->summary_created));
            json_object_set_new(s, "in_request",
                                json_boolean(r->summary_in_request));
            if (r->summary_created) {
                json_t *t = json_string(r->summary);
                bad |= !t;
                json_object_set_new(s, "text", t);
                json_object_set_new(
                    s, "usage",
                    json_pack("{s:I,s:I,s:I}", "prompt_tokens",
                              (json_int_t)r->summary_usage.prompt_tokens,
                              "completion_tokens",
                              (json_int_t)r->summary_usage.completion_tokens,
                              "total_tokens",
                              (json_int_t)r->summary_usage.total_tokens));
            }
        }
        SETN("summary", s);
    }
    if (r->user_cut || r->summary_error) {
        a = json_array();
        if (a && r->user_cut)
            bad |= json_array_append_new(
                       a, json_pack("{s:s,s:I,s:I}", "code",
                                    "user_message_too_large", "tokens",
                                    (json_int_t)r->user_tokens_before,
                                    "cut_to",
                                    (json_int_t)r->user_tokens_after)) != 0;
        if (a && r->summary_error) {
            json_t *w = json_pack("{s:s,s:s}", "code", "summary_failed",
                                  "message", r->summary_error);
            /* A message that is not UTF-8 still leaves the code. */
            if (!w)
                w = json_pack("{s:s}", "code", "summary_failed");
            bad |= json_array_append_new(a, w) != 0;
        }
        SETN("warnings", a);
    }
#undef SETN
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
