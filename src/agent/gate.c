/*
 * The call gate of runs (gate.h): per-run budgets as spends chained up a
 * tree of runs to the account gate, a call's worst case, and the
 * reservation made before every model call and settled after it.
 *
 * A level's check and its reservation happen under its lock in one
 * step, so concurrent calls (sub-agents run on tool threads) never take
 * a level past its limit: what is spent plus what is held never exceeds
 * it. A call reserves level by level from its own run up; when a level
 * (or the account gate, asked last) refuses, the levels below give back
 * what they held.
 */
#include "agent/gate.h"
#include "core/clock.h"
#include "core/error.h"
#include "loom/context.h"
#include "loom/router.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Prompt counts are kept below this (far beyond any context window). */
#define PROMPT_MAX (1L << 30)

struct loom__spend {
    atomic_int refs;
    pthread_mutex_t lock;
    loom_run_budget lim;
    int64_t start_ms;
    int64_t spent_micros, held_micros;
    int64_t spent_tokens, held_tokens;
    const loom_call_gate *outer;
    loom__spend *parent;
};

struct loom__ticket {
    loom__spend *s; /* a reference */
    int64_t micros; /* held at every level (0 for an unpriced call) */
    int64_t tokens;
    const loom_call_gate *outer; /* asked: settle it too */
    void *outer_ticket;
};

int loom__budget_any(const loom_run_budget *b)
{
    return b &&
           (b->max_cost_micros > 0 || b->max_tokens > 0 || b->max_seconds > 0);
}

int loom__spend_new(loom__spend **out, const loom_run_budget *limits,
                    const loom_call_gate *outer, loom__spend *parent)
{
    loom__spend *s = calloc(1, sizeof(*s));

    *out = NULL;
    if (!s)
        return loom__error_oom();
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->lock, NULL);
    if (limits)
        s->lim = *limits;
    s->start_ms = loom__mono_ms();
    s->outer = outer;
    s->parent = loom__spend_ref(parent);
    *out = s;
    return 0;
}

loom__spend *loom__spend_ref(loom__spend *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

void loom__spend_free(loom__spend *s)
{
    while (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        loom__spend *up = s->parent;
        pthread_mutex_destroy(&s->lock);
        free(s);
        s = up;
    }
}

void loom__spend_spent(loom__spend *s, int64_t *micros, int64_t *tokens,
                       int64_t *elapsed_ms)
{
    pthread_mutex_lock(&s->lock);
    *micros = s->spent_micros;
    *tokens = s->spent_tokens;
    *elapsed_ms = loom__mono_ms() - s->start_ms;
    pthread_mutex_unlock(&s->lock);
}

void loom__spend_carry(loom__spend *s, int64_t micros, int64_t tokens,
                       int64_t elapsed_ms)
{
    pthread_mutex_lock(&s->lock);
    s->spent_micros += micros > 0 ? micros : 0;
    s->spent_tokens += tokens > 0 ? tokens : 0;
    s->start_ms -= elapsed_ms > 0 ? elapsed_ms : 0;
    pthread_mutex_unlock(&s->lock);
}

const char *loom__refusal_name(loom__refusal why)
{
    switch (why) {
    case LOOM__REFUSED_COST:
        return "max_cost_usd";
    case LOOM__REFUSED_TOKENS:
        return "max_tokens";
    case LOOM__REFUSED_TIME:
        return "max_seconds";
    case LOOM__REFUSED_GATE:
        return "call_gate";
    default:
        return "";
    }
}

/* ---- the worst case ---------------------------------------------------- */

static size_t count_prompt(const loom_llm_request *req,
                           const loom_token_counter *counter)
{
    size_t n = 3; /* the reply's priming, as the counter counts it */

    if (counter)
        return loom_token_counter_request(counter, req->messages,
                                          req->messages_len, req->tools,
                                          req->tools ? req->tools_len : 0);
    for (size_t i = 0; i < req->messages_len; i++)
        n += loom_context_count_message(&req->messages[i], NULL);
    if (req->tools && req->tools_len)
        n += loom_context_count_tools(req->tools, req->tools_len, NULL);
    return n;
}

/* The cost of prompt tokens in and out tokens out at bound's prices. */
static int bound_cost(int64_t *out, const loom_call_bound *b, long in,
                      long outt)
{
    loom_model_prices pr = {.set = 1,
                            .input = b->input,
                            .cached_input = -1,
                            .cache_write = -1,
                            .output = b->output,
                            .reasoning = -1};
    loom_usage u;

    memset(&u, 0, sizeof(u));
    u.prompt_tokens = in;
    u.completion_tokens = outt;
    return loom_cost_compute(out, &u, &pr);
}

static int worst_of(loom__worst *w, const loom_call_bound *b)
{
    w->tokens = w->prompt_tokens + w->max_output;
    w->micros = -1;
    return b->priced
               ? bound_cost(&w->micros, b, w->prompt_tokens, w->max_output)
               : 0;
}

static int call_bound(loom_call_bound *b, loom__worst *w, loom_provider *p,
                      loom_llm_request *req, const loom_token_counter *counter,
                      size_t prompt_tokens)
{
    int rc;

    memset(w, 0, sizeof(*w));
    if ((rc = loom_provider_call_bound(p, req, b)) != 0)
        return rc;
    if (b->max_output <= 0) {
        /* Unbounded output has no worst case: the call gets a limit. */
        req->max_tokens = LOOM_RUN_BUDGET_DEFAULT_OUTPUT;
        b->max_output = LOOM_RUN_BUDGET_DEFAULT_OUTPUT;
    }
    if (!prompt_tokens)
        prompt_tokens = count_prompt(req, counter);
    w->prompt_tokens =
        prompt_tokens > (size_t)PROMPT_MAX ? PROMPT_MAX : (long)prompt_tokens;
    w->max_output = b->max_output;
    return 0;
}

int loom__call_worst(loom__worst *w, loom_provider *p, loom_llm_request *req,
                     const loom_token_counter *counter, size_t prompt_tokens)
{
    loom_call_bound b;
    int rc;

    if ((rc = call_bound(&b, w, p, req, counter, prompt_tokens)) != 0)
        return rc;
    return worst_of(w, &b);
}

/* ---- reservations ------------------------------------------------------ */

/* One level: the check and the hold in one step. */
static loom__refusal level_hold(loom__spend *s, const loom__worst *w, int final,
                                int64_t now)
{
    loom__refusal why = LOOM__REFUSED_NONE;
    int64_t micros = w->micros > 0 ? w->micros : 0;

    pthread_mutex_lock(&s->lock);
    if (s->lim.max_seconds > 0 && !final &&
        now - s->start_ms >= s->lim.max_seconds * 1000)
        why = LOOM__REFUSED_TIME;
    else if (s->lim.max_tokens > 0 &&
             s->spent_tokens + s->held_tokens + w->tokens > s->lim.max_tokens)
        why = LOOM__REFUSED_TOKENS;
    else if (s->lim.max_cost_micros > 0 &&
             (w->micros < 0 || s->spent_micros + s->held_micros + micros >
                                   s->lim.max_cost_micros))
        why = LOOM__REFUSED_COST;
    if (!why) {
        s->held_micros += micros;
        s->held_tokens += w->tokens;
    }
    pthread_mutex_unlock(&s->lock);
    return why;
}

/* Gives back what levels from s up to (not including) stop held, and
 * adds what the call really cost. */
static void levels_settle(loom__spend *s, const loom__spend *stop,
                          int64_t held_micros, int64_t held_tokens,
                          int64_t real_micros, int64_t real_tokens)
{
    for (; s && s != stop; s = s->parent) {
        pthread_mutex_lock(&s->lock);
        s->held_micros -= held_micros;
        s->held_tokens -= held_tokens;
        s->spent_micros += real_micros;
        s->spent_tokens += real_tokens;
        pthread_mutex_unlock(&s->lock);
    }
}

/* The first account gate from s up; NULL: none. */
static const loom_call_gate *outer_of(const loom__spend *s)
{
    for (; s; s = s->parent)
        if (s->outer && s->outer->reserve)
            return s->outer;
    return NULL;
}

/*
 * The most output tokens a last call of w's prompt fits into at every
 * level's limits (time aside), up to w->max_output; -1 when a level's
 * cost limit meets an unpriced call.
 */
static long room_for_output(const loom__spend *s, const loom__worst *w,
                            const loom_call_bound *b)
{
    long best = w->max_output, lo, hi;
    int64_t cost_room = -1;

    for (; s; s = s->parent) {
        loom__spend *m = (loom__spend *)s;
        int64_t left;
        pthread_mutex_lock(&m->lock);
        if (s->lim.max_tokens > 0) {
            left = s->lim.max_tokens - s->spent_tokens - s->held_tokens -
                   w->prompt_tokens;
            if (left < best)
                best = left < 0 ? 0 : (long)left;
        }
        if (s->lim.max_cost_micros > 0) {
            left = s->lim.max_cost_micros - s->spent_micros - s->held_micros;
            if (cost_room < 0 || left < cost_room)
                cost_room = left < 0 ? 0 : left;
        }
        pthread_mutex_unlock(&m->lock);
    }
    if (cost_room < 0 || best <= 0)
        return best;
    if (!b->priced)
        return -1;
    /* The largest output in [0, best] whose cost fits: costs grow with
     * the output, so a binary search over the exact cost finds it. */
    lo = 0;
    hi = best;
    while (lo < hi) {
        long mid = lo + (hi - lo + 1) / 2;
        int64_t c;
        if (bound_cost(&c, b, w->prompt_tokens, mid) == 0 && c <= cost_room)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Holds w at every level from s up: 0, or the refusal (nothing held). */
static loom__refusal hold_all(loom__spend *s, const loom__worst *w, int final)
{
    int64_t now = loom__mono_ms();
    loom__refusal why = LOOM__REFUSED_NONE;
    loom__spend *l;

    for (l = s; l && !why; l = why ? l : l->parent)
        why = level_hold(l, w, final, now);
    if (why)
        levels_settle(s, l, w->micros > 0 ? w->micros : 0, w->tokens, 0, 0);
    return why;
}

int loom__gate_reserve(const loom__gate *g, loom_provider *p, const char *model,
                       loom_llm_request *req, int final, size_t prompt_tokens,
                       loom__ticket **ticket, loom__refusal *why)
{
    const loom_call_gate *outer;
    loom_call_bound b;
    loom__worst w;
    loom__ticket *t;
    int rc;

    *ticket = NULL;
    *why = LOOM__REFUSED_NONE;
    if (!g || !g->spend)
        return 0;
    if ((rc = call_bound(&b, &w, p, req, g->counter, prompt_tokens)) != 0 ||
        (rc = worst_of(&w, &b)) != 0)
        return rc;
    *why = hold_all(g->spend, &w, final);
    if (*why && final && *why != LOOM__REFUSED_TIME) {
        long room = room_for_output(g->spend, &w, &b);
        if (room >= LOOM_RUN_BUDGET_MIN_OUTPUT && room < w.max_output) {
            req->max_tokens = room;
            w.max_output = room;
            if ((rc = worst_of(&w, &b)) != 0)
                return rc;
            *why = hold_all(g->spend, &w, final);
        }
    }
    if (*why)
        return 0;
    if (!(t = calloc(1, sizeof(*t)))) {
        levels_settle(g->spend, NULL, w.micros > 0 ? w.micros : 0, w.tokens, 0,
                      0);
        return loom__error_oom();
    }
    t->s = loom__spend_ref(g->spend);
    t->micros = w.micros > 0 ? w.micros : 0;
    t->tokens = w.tokens;
    outer = outer_of(g->spend);
    if (outer && outer->reserve(outer->payload, model, w.micros, w.tokens,
                                &t->outer_ticket) != 0) {
        levels_settle(t->s, NULL, t->micros, t->tokens, 0, 0);
        loom__spend_free(t->s);
        free(t);
        *why = LOOM__REFUSED_GATE;
        return 0;
    }
    t->outer = outer;
    *ticket = t;
    return 0;
}

void loom__gate_settle(loom__ticket *t, const loom_llm_response *resp)
{
    int64_t micros = 0, tokens = 0;

    if (!t)
        return;
    if (resp) {
        const loom_usage *u = &resp->usage;
        micros = resp->cost_known && u->cost_micros > 0 ? u->cost_micros : 0;
        tokens = u->total_tokens > 0
                     ? u->total_tokens
                     : (int64_t)u->prompt_tokens + u->completion_tokens;
        if (tokens < 0)
            tokens = 0;
    }
    levels_settle(t->s, NULL, t->micros, t->tokens, micros, tokens);
    if (t->outer && t->outer->settle)
        t->outer->settle(t->outer->payload, t->outer_ticket, micros,
                         (long)tokens);
    loom__spend_free(t->s);
    free(t);
}

int loom__gated_complete(const loom__gate *g, loom_provider *p,
                         loom_llm_request *req, loom_llm_event_cb cb,
                         void *payload, loom_llm_response *resp,
                         loom_cancel *cancel)
{
    loom__ticket *t = NULL;
    loom__refusal why;
    int rc;

    if ((rc = loom__gate_reserve(g, p, p->name, req, 0, 0, &t, &why)) != 0)
        return rc;
    if (why)
        return loom__error_set(LOOM_ETOOLARGE,
                               "the call would pass the run's budget (%s)",
                               loom__refusal_name(why));
    rc = loom_provider_complete(p, req, cb, payload, resp, cancel);
    loom__gate_settle(t, resp);
    return rc;
}
