/*
 * Internal: what every model call of a run asks first (loom/run.h
 * loom_call_gate, loom_run_budget).
 *
 * A spend (loom__spend) is the budget of one run: its limits, what its
 * calls and its sub-agents' have cost so far and what their calls in
 * flight have reserved, and the account gate (the top run's). A run
 * without limits of its own under a parent shares its parent's spend; a
 * run with limits has its own, chained to its parent's, so a call
 * reserves at every level up to the account gate and is refused when any
 * level would pass its limit. Spends are shared by the runs of a tree,
 * which run on several threads: every operation takes the spend's lock.
 *
 * A gate (loom__gate) is what a caller of the provider holds: the spend
 * and the token counter the worst case is counted with. loom__gate_reserve
 * works out the call's worst case (loom__call_worst: the one rule for
 * every caller) and reserves it; loom__gate_settle replaces the
 * reservation by what the call cost. loom__gated_complete does both
 * around one provider call, for the side calls (reviews, summaries,
 * argument repair).
 */
#ifndef LOOM_AGENT_GATE_H
#define LOOM_AGENT_GATE_H

#include "loom/run.h"
#include "loom/tokenizer.h"

#include <stdint.h>

typedef struct loom__spend loom__spend;

/*
 * A spend with limits (NULL or all zero: none), under parent (a
 * reference is taken; NULL: the top) and with the account gate outer
 * (borrowed; NULL: none). Its clock starts now. 0 or LOOM_ENOMEM.
 */
int loom__spend_new(loom__spend **out, const loom_run_budget *limits,
                    const loom_call_gate *outer, loom__spend *parent);
/* Another reference (thread-safe); NULL is returned as it is. */
loom__spend *loom__spend_ref(loom__spend *s);
/* Drops a reference; NULL is a no-op. */
void loom__spend_free(loom__spend *s);
/*
 * A resumed run's spend (research runs, run_internal.h loom__run_restore)
 * goes on from what it had spent before the stop.
 * loom__spend_spent: what the spend's calls and its sub-agents' cost so
 * far (settled, not held) and the milliseconds since its clock started.
 * loom__spend_carry: adds micros and tokens to what the spend (this
 * level only: a resumed run is a top run) has spent and starts its clock
 * elapsed_ms earlier, so its limits hold as if the stop had not happened.
 */
void loom__spend_spent(loom__spend *s, int64_t *micros, int64_t *tokens,
                       int64_t *elapsed_ms);
void loom__spend_carry(loom__spend *s, int64_t micros, int64_t tokens,
                       int64_t elapsed_ms);

/* Whether limits (NULL or all zero) hold any limit. */
int loom__budget_any(const loom_run_budget *limits);

/* Why a call was refused. */
typedef enum {
    LOOM__REFUSED_NONE = 0,
    LOOM__REFUSED_COST,   /* a run's max_cost (or an unpriced model) */
    LOOM__REFUSED_TOKENS, /* a run's max_tokens */
    LOOM__REFUSED_TIME,   /* a run's max_seconds */
    LOOM__REFUSED_GATE    /* the account gate */
} loom__refusal;

/* The name a refusal is reported by: "max_cost_usd", "max_tokens",
 * "max_seconds", "call_gate" ("" for none). */
const char *loom__refusal_name(loom__refusal why);

/* A call's worst case. */
typedef struct {
    long prompt_tokens; /* counted */
    long max_output;    /* the output limit the call carries */
    int64_t micros;     /* -1: a model the call may reach has no prices */
    long tokens;        /* prompt_tokens + max_output */
} loom__worst;

/*
 * The worst case of req sent to p: its prompt counted with counter
 * (NULL: loom's crude count; prompt_tokens > 0: that count instead), its
 * output limit (loom_provider_call_bound; none known:
 * LOOM_RUN_BUDGET_DEFAULT_OUTPUT, which is then put into req->max_tokens
 * so the call keeps to it) at the highest prices it may meet. 0,
 * LOOM_ETOOLARGE when the cost does not fit in 63 bits.
 */
int loom__call_worst(loom__worst *w, loom_provider *p, loom_llm_request *req,
                     const loom_token_counter *counter, size_t prompt_tokens);

typedef struct loom__gate {
    loom__spend *spend; /* NULL: calls go unasked */
    const loom_token_counter *counter;
} loom__gate;

typedef struct loom__ticket loom__ticket;

/*
 * Reserves the worst case of req (to p, reported as model) at every
 * level of the gate's spend and at its account gate. final: the call is
 * a run's last, without tools: the time limit does not hold for it, and
 * when its worst case does not fit the runs' limits its output limit
 * (req->max_tokens) is cut to what fits, down to
 * LOOM_RUN_BUDGET_MIN_OUTPUT. prompt_tokens: as loom__call_worst. On 0,
 * *ticket is the reservation (NULL when the gate has no spend) and
 * *why is LOOM__REFUSED_NONE, or the call is refused (*ticket NULL) and
 * *why says by what. Errors: LOOM_ENOMEM, LOOM_ETOOLARGE.
 */
int loom__gate_reserve(const loom__gate *g, loom_provider *p, const char *model,
                       loom_llm_request *req, int final, size_t prompt_tokens,
                       loom__ticket **ticket, loom__refusal *why);

/* Settles a reservation to what the call cost (resp: its usage, priced
 * or not; a failed call's is what it reported, often nothing) and frees
 * it. NULL ticket: a no-op. */
void loom__gate_settle(loom__ticket *ticket, const loom_llm_response *resp);

/*
 * loom_provider_complete between a reserve (not final) and its settle. A
 * refused call is not made: LOOM_ETOOLARGE, its message naming the
 * limit, resp untouched. NULL g or spend: the call as it is.
 */
int loom__gated_complete(const loom__gate *g, loom_provider *p,
                         loom_llm_request *req, loom_llm_event_cb cb,
                         void *payload, loom_llm_response *resp,
                         loom_cancel *cancel);

/* The gate a context engine's summary calls go through (context.c; NULL:
 * none). Borrowed: it must outlive the engine. */
struct loom_context;
void loom__context_set_gate(struct loom_context *ctx, const loom__gate *gate);

#endif
