/*
 * Sub-agents: an agent of a session offered as a tool (see subagent.h and
 * docs/agents.md "Sub-agents").
 *
 * The tool runs on its call's thread. It checks the tree's limits (depth,
 * runs per top-level turn), starts a child turn of the session with the
 * task as its one user message, runs it on that same thread and answers
 * with the child's final text. The child's cancel flag follows the call's
 * (loom/cancel.h), so cancelling the parent, or the parent giving up on
 * the call, stops the child and, through its own tool calls, every run
 * below it. Whatever the outcome, the tool leaves a report of the child
 * (loom__run_report) on its host for the parent to merge: usage, each
 * agent's share, the calls it made and its tool records; documents go
 * through the call's documents like any tool's. The child's events go
 * into the parent's stream as they happen, through the call's events
 * channel (forward), so a tree of runs is one stream: the child's
 * events carry where they come from, and its descendants' pass through
 * it the same way.
 */
#include "agent/subagent.h"
#include "agent/emit.h"
#include "agent/research.h"
#include "agent/run_internal.h"
#include "agent/session_internal.h"
#include "agent/toolexec.h"
#include "core/error.h"
#include "loom/buf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a child's user message (task and context): more is refused
 * as a tool error the model reads. */
#define SUB_TASK_MAX (256 * 1024)

/* A sub-agent run executing now: borrowed while it is in the list. */
typedef struct {
    loom_run *run;
    char *parent_id;      /* the run whose call started it */
    char *parent_call_id; /* that call */
} live_run;

struct loom__agent_tree {
    atomic_int refs;
    loom_session *s;
    int max_depth;
    int max_sub_runs;
    atomic_int sub_runs;
    char *conversation_id; /* the top turn's, where children are stored */
    /* 1 while that conversation is deferred (created by the first write
     * in it, which holds conv_mu) */
    atomic_int conv_deferred;
    pthread_mutex_t conv_mu;
    loom__elicits *elicits; /* the forms the tree's calls wait on */
    json_t *user_settings;  /* the top turn's, or NULL */
    loom_usage_account account; /* the top turn's; strings owned */
    /* the live sub-agent runs, in the order they started */
    pthread_mutex_t mu;
    live_run *live;
    size_t nlive, caplive;
};

int loom__agent_tree_new(loom__agent_tree **out, loom_session *s, int max_depth,
                         int max_sub_runs)
{
    loom__agent_tree *t = calloc(1, sizeof(*t));

    *out = NULL;
    if (!t)
        return loom__error_oom();
    if (loom__elicits_new(&t->elicits) != 0) {
        free(t);
        return LOOM_ENOMEM;
    }
    atomic_init(&t->refs, 1);
    atomic_init(&t->sub_runs, 0);
    atomic_init(&t->conv_deferred, 0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->conv_mu, NULL);
    loom__session_ref(s);
    t->s = s;
    t->max_depth = max_depth > 0 ? max_depth : LOOM__SUB_DEFAULT_MAX_DEPTH;
    t->max_sub_runs =
        max_sub_runs > 0 ? max_sub_runs : LOOM__SUB_DEFAULT_MAX_RUNS;
    *out = t;
    return 0;
}

/* Frees the strings of an account the tree owns. */
static void account_clear(loom_usage_account *a)
{
    free((char *)a->key_id);
    free((char *)a->workspace);
    free((char *)a->user);
    free((char *)a->end_user);
    memset(a, 0, sizeof(*a));
}

loom__agent_tree *loom__agent_tree_ref(loom__agent_tree *t)
{
    if (t)
        atomic_fetch_add(&t->refs, 1);
    return t;
}

void loom__agent_tree_free(loom__agent_tree *t)
{
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    loom_session_free(t->s);
    free(t->conversation_id);
    loom__elicits_free(t->elicits);
    json_decref(t->user_settings);
    account_clear(&t->account);
    for (size_t i = 0; i < t->nlive; i++) {
        free(t->live[i].parent_id);
        free(t->live[i].parent_call_id);
    }
    free(t->live);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->conv_mu);
    free(t);
}

loom__elicits *loom__agent_tree_elicits(const loom__agent_tree *t)
{
    return t ? t->elicits : NULL;
}

int loom__agent_tree_set_conversation(loom__agent_tree *t, const char *id)
{
    free(t->conversation_id);
    t->conversation_id = NULL;
    if (id && !(t->conversation_id = strdup(id)))
        return loom__error_oom();
    return 0;
}

const char *loom__agent_tree_conversation(const loom__agent_tree *t)
{
    return t ? t->conversation_id : NULL;
}

void loom__agent_tree_defer_conversation(loom__agent_tree *t)
{
    atomic_store(&t->conv_deferred, 1);
}

int loom__agent_tree_conversation_deferred(loom__agent_tree *t)
{
    return t && atomic_load(&t->conv_deferred);
}

int loom__agent_tree_conversation_write(loom__agent_tree *t,
                                        int (*write)(void *arg, int create),
                                        void *arg)
{
    int rc;

    /* Deferred only goes from 1 to 0: once 0, no lock is needed. */
    if (!atomic_load(&t->conv_deferred))
        return write(arg, 0);
    pthread_mutex_lock(&t->conv_mu);
    rc = write(arg, atomic_load(&t->conv_deferred));
    if (rc == 0)
        atomic_store(&t->conv_deferred, 0);
    pthread_mutex_unlock(&t->conv_mu);
    return rc;
}

void loom__agent_tree_set_user_settings(loom__agent_tree *t, json_t *settings)
{
    json_decref(t->user_settings);
    t->user_settings = json_incref(settings);
}

const json_t *loom__agent_tree_user_settings(const loom__agent_tree *t)
{
    return t ? t->user_settings : NULL;
}

/* A copy of s into *out (NULL stays NULL); 1 when out of memory. */
static int dup_into(const char **out, const char *s)
{
    *out = s ? strdup(s) : NULL;
    return s && !*out;
}

int loom__agent_tree_set_account(loom__agent_tree *t,
                                 const loom_usage_account *a)
{
    loom_usage_account c = {0};

    if (dup_into(&c.key_id, a->key_id) | dup_into(&c.workspace, a->workspace) |
        dup_into(&c.user, a->user) | dup_into(&c.end_user, a->end_user)) {
        account_clear(&c);
        return loom__error_oom();
    }
    account_clear(&t->account);
    t->account = c;
    return 0;
}

const loom_usage_account *loom__agent_tree_account(const loom__agent_tree *t)
{
    return &t->account;
}

loom_session *loom__agent_tree_session(const loom__agent_tree *t)
{
    return t->s;
}

int loom__agent_tree_max_depth(const loom__agent_tree *t)
{
    return t->max_depth;
}

int loom__agent_tree_max_runs(const loom__agent_tree *t)
{
    return t->max_sub_runs;
}

int loom__agent_tree_take_run(loom__agent_tree *t)
{
    return atomic_fetch_add(&t->sub_runs, 1) < t->max_sub_runs;
}

/* ---- live runs --------------------------------------------------------- */

int loom__agent_tree_join(loom__agent_tree *t, loom_run *run,
                          const char *parent_id, const char *parent_call_id)
{
    char *pid = strdup(parent_id ? parent_id : "");
    char *cid = strdup(parent_call_id ? parent_call_id : "");
    int rc = 0;

    if (!pid || !cid) {
        free(pid);
        free(cid);
        return loom__error_oom();
    }
    pthread_mutex_lock(&t->mu);
    if (t->nlive == t->caplive) {
        size_t c = t->caplive ? t->caplive * 2 : 4;
        live_run *p = realloc(t->live, c * sizeof(*p));
        if (!p) {
            rc = loom__error_oom();
            goto out;
        }
        t->live = p;
        t->caplive = c;
    }
    t->live[t->nlive].run = run;
    t->live[t->nlive].parent_call_id = cid;
    t->live[t->nlive++].parent_id = pid;
    pid = cid = NULL;
out:
    pthread_mutex_unlock(&t->mu);
    free(pid);
    free(cid);
    return rc;
}

void loom__agent_tree_leave(loom__agent_tree *t, const loom_run *run)
{
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nlive; i++) {
        if (t->live[i].run != run)
            continue;
        free(t->live[i].parent_id);
        free(t->live[i].parent_call_id);
        memmove(&t->live[i], &t->live[i + 1],
                (t->nlive - i - 1) * sizeof(t->live[0]));
        t->nlive--;
        break;
    }
    pthread_mutex_unlock(&t->mu);
}

/* The live run of that id, or NULL. Under t->mu. */
static const live_run *live_find(const loom__agent_tree *t, const char *id)
{
    for (size_t i = 0; i < t->nlive; i++)
        if (strcmp(loom_run_id(t->live[i].run), id) == 0)
            return &t->live[i];
    return NULL;
}

/* Whether r was started, through any number of levels, by the run
 * above (an id). Under t->mu. */
static int live_below(const loom__agent_tree *t, const live_run *r,
                      const char *above)
{
    /* A chain is at most as long as the list. */
    for (size_t n = 0; r && n <= t->nlive; n++) {
        if (strcmp(r->parent_id, above) == 0)
            return 1;
        r = live_find(t, r->parent_id);
    }
    return 0;
}

int loom__agent_tree_has(loom__agent_tree *t, const char *above,
                         const char *run_id)
{
    const live_run *r;
    int has;

    if (!t || !above || !run_id)
        return 0;
    pthread_mutex_lock(&t->mu);
    r = live_find(t, run_id);
    has = r && live_below(t, r, above);
    pthread_mutex_unlock(&t->mu);
    return has;
}

int loom__agent_tree_call_waits(loom__agent_tree *t, const char *run_id,
                                const char *call_id)
{
    int waits = 0;

    if (!t || !run_id || !call_id)
        return 0;
    if (loom__elicits_call_waits(t->elicits, run_id, call_id))
        return 1;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nlive && !waits; i++) {
        const live_run *r = &t->live[i];
        if (!loom_run_approvals_waiting(r->run) &&
            !loom__elicits_run_waits(t->elicits, loom_run_id(r->run)))
            continue;
        /* Up from the waiting run to the call that started its branch. */
        for (size_t k = 0; r && k <= t->nlive && !waits; k++) {
            waits = strcmp(r->parent_id, run_id) == 0 &&
                    strcmp(r->parent_call_id, call_id) == 0;
            r = live_find(t, r->parent_id);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return waits;
}

size_t loom__agent_tree_waiting(loom__agent_tree *t, const char *above)
{
    size_t w = 0;

    if (!t || !above)
        return 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nlive; i++)
        if (live_below(t, &t->live[i], above))
            w += loom_run_approvals_waiting(t->live[i].run);
    pthread_mutex_unlock(&t->mu);
    return w;
}

int loom__agent_tree_approve(loom__agent_tree *t, const char *above,
                             const char *run_id, const char *call_id,
                             int approve, const char *reason)
{
    loom_run *found = NULL;
    size_t n = 0;
    int rc;

    if (!t || !above)
        return loom__error_set(LOOM_ENOTFOUND, "no sub-agent runs");
    /* The approvals' lock is a leaf under t->mu: answering under it
     * keeps the run from leaving meanwhile. */
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nlive; i++) {
        const live_run *r = &t->live[i];
        if ((run_id && strcmp(loom_run_id(r->run), run_id) != 0) ||
            !live_below(t, r, above))
            continue;
        if (run_id || loom__run_approval_waits(r->run, call_id)) {
            found = r->run;
            n++;
        }
    }
    if (n == 1)
        rc = loom_run_approve(found, call_id, approve, reason);
    else if (n > 1)
        rc = loom__error_set(LOOM_EEXISTS,
                             "call '%s' waits for approval in %zu sub-agent "
                             "runs of run %s: name the run",
                             call_id, n, above);
    else if (run_id)
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "no sub-agent run %s is going on under run %s",
                             run_id, above);
    else
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "no call '%s' waits for approval in run %s or "
                             "its sub-agents",
                             call_id, above);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int loom__tool_host_init(loom__tool_host *h, const loom__run_place *p)
{
    memset(h, 0, sizeof(*h));
    if (!p)
        return 0;
    h->depth = p->depth;
    h->index = p->index;
    if ((p->run_id && !(h->run_id = strdup(p->run_id))) ||
        (p->agent && !(h->agent = strdup(p->agent))) ||
        (p->model && !(h->model = strdup(p->model)))) {
        loom__tool_host_clear(h);
        return loom__error_oom();
    }
    h->tree = loom__agent_tree_ref(p->tree);
    h->spend = loom__spend_ref(p->spend);
    return 0;
}

void loom__tool_host_clear(loom__tool_host *h)
{
    loom__agent_tree_free(h->tree);
    loom__spend_free(h->spend);
    free(h->run_id);
    free(h->agent);
    free(h->model);
    json_decref(h->report);
    memset(h, 0, sizeof(*h));
}

/* ---- usage ------------------------------------------------------------- */

json_t *loom__usage_full(const loom_usage *u, int priced, int unpriced)
{
    pk p = pk_new();

    pk_usage_tokens(&p, u);
    pk_int(&p, "cache_write_tokens", (json_int_t)u->cache_write_tokens);
    pk_int(&p, "cost_micros", (json_int_t)u->cost_micros);
    pk_int(&p, "priced_calls", priced);
    pk_int(&p, "unpriced_calls", unpriced);
    return pk_done(&p);
}

static long get_long(const json_t *j, const char *key)
{
    return (long)json_integer_value(json_object_get(j, key));
}

void loom__usage_from_full(const json_t *j, loom_usage *u, int *priced,
                           int *unpriced)
{
    memset(u, 0, sizeof(*u));
    u->prompt_tokens = get_long(j, "prompt_tokens");
    u->completion_tokens = get_long(j, "completion_tokens");
    u->cached_tokens = get_long(j, "cached_tokens");
    u->reasoning_tokens = get_long(j, "reasoning_tokens");
    u->total_tokens = get_long(j, "total_tokens");
    u->cache_write_tokens = get_long(j, "cache_write_tokens");
    u->cost_micros =
        (int64_t)json_integer_value(json_object_get(j, "cost_micros"));
    *priced = (int)get_long(j, "priced_calls");
    *unpriced = (int)get_long(j, "unpriced_calls");
}

int loom__by_agent_add(json_t *by, const char *agent, const loom_usage *u,
                       int priced, int unpriced)
{
    const json_t *had = json_object_get(by, agent);
    loom_usage sum;
    int p = 0, q = 0;
    json_t *j;

    loom__usage_from_full(had, &sum, &p, &q);
    loom_usage_add(&sum, u);
    j = loom__usage_full(&sum, p + priced, q + unpriced);
    if (!j || json_object_set_new(by, agent, j) != 0)
        return loom__error_oom();
    return 0;
}

json_t *loom__by_agent_public(const json_t *by)
{
    json_t *out = json_object();
    const char *agent;
    json_t *v;

    json_object_foreach((json_t *)by, agent, v)
    {
        json_t *u = json_deep_copy(v);
        int priced = (int)get_long(v, "priced_calls");
        int unpriced = (int)get_long(v, "unpriced_calls");
        if (!u || !out) {
            json_decref(u);
            json_decref(out);
            return NULL;
        }
        json_object_del(u, "priced_calls");
        json_object_del(u, "unpriced_calls");
        /* As the run's own usage: a cost only when every call had one. */
        if (!priced || unpriced)
            json_object_del(u, "cost_micros");
        if (!get_long(v, "cache_write_tokens"))
            json_object_del(u, "cache_write_tokens");
        json_object_set_new(out, agent, u);
    }
    return out;
}

/* ---- the tool ---------------------------------------------------------- */

typedef struct {
    loom_session *s;
    int own_ref;
    char *agent;
    char *model;
    int max_iterations;
} agent_tool;

static void agent_tool_free(void *payload)
{
    agent_tool *p = payload;

    if (!p)
        return;
    if (p->own_ref)
        loom_session_free(p->s);
    free(p->agent);
    free(p->model);
    free(p);
}

/* The child's one user message: the task, then the context if any. */
static int child_input(loom_messages *in, const json_t *args)
{
    const char *task = json_string_value(json_object_get(args, "task"));
    const char *context = json_string_value(json_object_get(args, "context"));
    loom_buf b = LOOM_BUF_INIT(SUB_TASK_MAX);
    int rc;

    rc = loom_buf_printf(&b, "%s", task ? task : "");
    if (!rc && context && *context)
        rc = loom_buf_printf(&b, "\n\nContext:\n%s", context);
    if (!rc)
        rc = loom_messages_add(in, LOOM_ROLE_USER, b.ptr ? b.ptr : "");
    loom_buf_free(&b);
    return rc;
}

/* Adds the child's documents to the call's (the parent's seen set and
 * citations), at most what a call may report. */
static void pass_documents(const loom_tool_ctx *ctx, const loom_run *run)
{
    const json_t *docs = loom_run_documents(run);
    size_t i;
    json_t *d;

    if (!ctx->documents)
        return;
    json_array_foreach(docs, i, d)
    {
        if (json_array_size(ctx->documents) >= LOOM_TOOL_DOCUMENTS_MAX)
            break;
        json_array_append(ctx->documents, d);
    }
}

/* The call fails with msg (in out when it fits), code rc. */
static int refuse(loom_buf *out, int rc, const char *msg)
{
    loom_buf_clear(out);
    if (loom_buf_printf(out, "%s", msg) != 0)
        loom__error_set(rc, "%s", msg);
    return rc;
}

/* A child turn's sink (forward): the call that runs it, and the nested
 * fields of its own events, made once and shared by all of them
 * (immutable, atomic counts). */
typedef struct {
    const loom_tool_ctx *ctx;
    json_t *parent_run_id;
    json_t *parent_call_id;
    json_t *agent;
    json_t *depth;
    json_t *run_id; /* the child run's id, once seen */
} forwarder;

static void forwarder_clear(forwarder *f)
{
    json_decref(f->parent_run_id);
    json_decref(f->parent_call_id);
    json_decref(f->agent);
    json_decref(f->depth);
    json_decref(f->run_id);
    memset(f, 0, sizeof(*f));
}

static int forwarder_init(forwarder *f, const loom_tool_ctx *ctx,
                          const char *agent, int depth)
{
    const loom__tool_host *h = ctx->host;

    memset(f, 0, sizeof(*f));
    f->ctx = ctx;
    if (!(f->parent_run_id = json_string(h->run_id ? h->run_id : "")) ||
        !(f->parent_call_id = json_string(ctx->call_id ? ctx->call_id : "")) ||
        !(f->agent = json_string(agent)) || !(f->depth = json_integer(depth))) {
        forwarder_clear(f);
        return loom__error_oom();
    }
    return 0;
}

/* ev's run id as a JSON string (NULL: none): the child run's is made
 * once. */
static json_t *event_run_id(forwarder *f, const loom_event *ev)
{
    const char *id = ev->run_id;

    if (!id)
        return NULL;
    if (f->run_id && strcmp(json_string_value(f->run_id), id) == 0)
        return json_incref(f->run_id);
    if (!f->run_id && loom_event_depth(ev) == 0)
        return json_incref(f->run_id = json_string(id));
    return json_string(id);
}

/* Containers deeper than this are copied by jansson (json_deep_copy). */
#define SHARE_DEPTH_MAX 32

/*
 * v as the parent's stream gets it: its objects and arrays copied, since
 * the child may keep and change its own, and its strings, numbers and
 * literals shared (json_incref), since nothing changes those once made
 * (loom never calls json_*_set on them) and their counts are atomic.
 * NULL when out of memory.
 */
static json_t *share_copy(json_t *v, int depth)
{
    json_t *c, *x;
    const char *k;
    size_t i;

    if (!json_is_object(v) && !json_is_array(v))
        return json_incref(v);
    if (depth >= SHARE_DEPTH_MAX)
        return json_deep_copy(v);
    if (json_is_array(v)) {
        if (!(c = json_array()))
            return NULL;
        json_array_foreach(v, i, x)
        {
            if (json_array_append_new(c, share_copy(x, depth + 1)) != 0) {
                json_decref(c);
                return NULL;
            }
        }
        return c;
    }
    if (!(c = json_object()))
        return NULL;
    json_object_foreach(v, k, x)
    {
        if (json_object_set_new_nocheck(c, k, share_copy(x, depth + 1)) != 0) {
            json_decref(c);
            return NULL;
        }
    }
    return c;
}

/*
 * Sends an event of the child turn into the parent's stream through the
 * call's events channel (docs/events.md "Nested events"). The child's
 * own events get the nested fields first (parent_run_id, parent_call_id,
 * agent, depth); its descendants' already have theirs, from the child's
 * own calls. Every one gets its run_id (the envelope's, which the
 * parent's run puts back there) and its index in the parent's timeline:
 * the call's index plus the event's. The child's answer text also
 * streams to the call as tool.delta. Runs on the call's thread; the
 * event is a copy (share_copy), since the child keeps its own.
 */
static int forward(const loom_event *ev, void *payload)
{
    forwarder *f = payload;
    const loom__tool_host *h = f->ctx->host;
    const json_t *delta = NULL;
    json_t *d = json_object(), *x;
    const char *k;

    if (!d || !json_is_object(ev->data))
        goto done;
    if (loom_event_depth(ev) == 0) {
        json_object_set_nocheck(d, "parent_run_id", f->parent_run_id);
        json_object_set_nocheck(d, "parent_call_id", f->parent_call_id);
        json_object_set_nocheck(d, "agent", f->agent);
        json_object_set_nocheck(d, "depth", f->depth);
        if (ev->type == LOOM_EV_MESSAGE_DELTA)
            delta = json_object_get(ev->data, "delta");
    }
    json_object_foreach(ev->data, k, x)
    {
        if (json_object_set_new_nocheck(d, k, share_copy(x, 1)) != 0)
            goto done;
    }
    if (json_object_set_new_nocheck(d, "run_id", event_run_id(f, ev)) != 0 ||
        json_object_set_new_nocheck(
            d, "index", json_integer((json_int_t)h->index + ev->index)) != 0)
        goto done;
    (void)loom__tool_ctx_event(f->ctx, ev->type, d);
    d = NULL;
    if (json_string_length(delta))
        loom_tool_delta(f->ctx, json_string_value(delta),
                        json_string_length(delta));
done:
    json_decref(d);
    return 0;
}

int loom__sub_run(const loom_tool_ctx *ctx, loom_session *s, int any_session,
                  loom_turn_options *o, loom_buf *out, loom_turn **child_out,
                  int *child_rc)
{
    loom__tool_host *h = ctx->host;
    loom__turn_child child;
    forwarder fw = {0};
    const loom_run *run;
    loom_turn *t = NULL;
    char msg[512];
    int rc;

    *child_out = NULL;
    *child_rc = 0;
    if (!h || !h->tree ||
        (!any_session && loom__agent_tree_session(h->tree) != s))
        return refuse(out, LOOM_EINVALID,
                      "sub-agents run only inside a turn of their session");
    if (h->depth + 1 > loom__agent_tree_max_depth(h->tree)) {
        snprintf(msg, sizeof(msg),
                 "agent '%s' was not run: sub-agents may nest %d deep and "
                 "this call would be at depth %d. Do the task yourself or "
                 "answer with what you have.",
                 o->agent, loom__agent_tree_max_depth(h->tree), h->depth + 1);
        return refuse(out, LOOM_EINVALID, msg);
    }
    if (!loom__agent_tree_take_run(h->tree)) {
        snprintf(msg, sizeof(msg),
                 "agent '%s' was not run: this turn already started its "
                 "%d sub-agent runs. Answer with what you have.",
                 o->agent, loom__agent_tree_max_runs(h->tree));
        return refuse(out, LOOM_EINVALID, msg);
    }
    o->user_id = ctx->user_id;
    o->user_keys = ctx->user_keys;
    if (ctx->events) {
        if ((rc = forwarder_init(&fw, ctx, o->agent, h->depth + 1)) != 0)
            return rc;
        o->sink = (loom_sink){forward, &fw};
    }
    memset(&child, 0, sizeof(child));
    child.tree = h->tree;
    child.depth = h->depth + 1;
    child.cancel = ctx->cancel;
    child.parent_run_id = h->run_id;
    child.parent_call_id = ctx->call_id;
    child.spend = h->spend;
    rc = loom__turn_new_child(&t, s, o, &child);
    if (rc != 0) {
        forwarder_clear(&fw);
        return rc;
    }
    *child_rc = loom_turn_execute(t);
    /* The child sends no more events. */
    forwarder_clear(&fw);
    run = loom_turn_run(t);
    json_decref(h->report);
    h->report = run ? loom__run_report(run) : NULL;
    if (run)
        pass_documents(ctx, run);
    if (run && ctx->cost_micros && loom_run_cost_known(run))
        *ctx->cost_micros = loom_run_usage(run)->cost_micros;
    *child_out = t;
    return 0;
}

int loom__sub_failure(loom_buf *out, const char *agent, loom_turn *t, int rc)
{
    const loom_run *run = loom_turn_run(t);
    const char *err =
        run && *loom_run_error(run) ? loom_run_error(run) : loom_error_last();
    const char *partial = run ? loom_run_text(run) : "";

    loom_buf_clear(out);
    if (loom_buf_printf(out, "agent '%s' %s: %s", agent,
                        rc == LOOM_ECANCELED ? "was stopped" : "failed",
                        err && *err ? err : loom_error_name(rc)) == 0 &&
        *partial)
        (void)loom_buf_printf(out, "\nPartial answer: %s", partial);
    return rc ? rc : LOOM_ERROR;
}

static int run_child(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    agent_tool *p = payload;
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_run *run;
    loom_turn *t = NULL;
    int rc, crc;

    if ((rc = child_input(&in, args)) != 0)
        return rc;
    o.agent = p->agent;
    o.model = p->model;
    o.max_iterations = p->max_iterations;
    o.input = &in;
    rc = loom__sub_run(ctx, p->s, p->own_ref, &o, out, &t, &crc);
    loom_messages_free(&in);
    if (rc != 0)
        return rc;
    run = loom_turn_run(t);
    if (crc == 0 && run) {
        loom_buf_clear(out);
        rc = loom_buf_printf(out, "%s", loom_run_text(run));
    } else {
        rc = loom__sub_failure(out, p->agent, t, crc);
    }
    loom_turn_free(t);
    return rc;
}

int loom__tool_is_agent(const loom_tool *tool)
{
    return tool &&
           (tool->execute == run_child || loom__research_tool_is_agent(tool));
}

/* {"task": string (required), "context": string}. */
static json_t *agent_tool_schema(void)
{
    return json_pack(
        "{s:s,s:{s:{s:s,s:s},s:{s:s,s:s}},s:[s],s:b}", "type", "object",
        "properties", "task", "type", "string", "description",
        "What the agent should do, with everything it needs to know.",
        "context", "type", "string", "description",
        "Optional background: what is known so far, constraints.", "required",
        "task", "additionalProperties", 0);
}

int loom__agent_tool_add(loom_tool_registry *reg, loom_session *s,
                         const char *agent, const char *name,
                         const char *description, const char *model,
                         int max_iterations, int own_ref)
{
    const loom_agent_config *a =
        loom_config_agent(loom_session_config(s), agent ? agent : "");
    loom_tool tool = LOOM_TOOL_INIT;
    char generic[160];
    agent_tool *p;
    json_t *schema;
    int rc;

    if (!a)
        return loom__error_set(LOOM_ENOTFOUND, "no agent named '%s'",
                               agent ? agent : "(null)");
    if (!description)
        description = a->description;
    if (!description) {
        snprintf(generic, sizeof(generic),
                 "Runs the agent '%s' on a task and returns its answer.",
                 a->name);
        description = generic;
    }
    if (!(p = calloc(1, sizeof(*p))) || !(p->agent = strdup(a->name)) ||
        (model && !(p->model = strdup(model))) ||
        !(schema = agent_tool_schema())) {
        agent_tool_free(p);
        return loom__error_oom();
    }
    p->s = s;
    p->max_iterations = max_iterations;
    tool.name = name ? name : a->name;
    tool.description = description;
    tool.parameters = schema;
    tool.execute = run_child;
    tool.payload = p;
    tool.free_payload = agent_tool_free;
    rc = loom_tool_registry_add(reg, &tool);
    json_decref(schema);
    if (rc != 0) {
        agent_tool_free(p);
        return rc;
    }
    /* Only once added: on failure the caller's session keeps its refs. */
    if (own_ref) {
        p->own_ref = 1;
        loom__session_ref(s);
    }
    return 0;
}

int loom_session_agent_tool(loom_tool_registry *reg, loom_session *s,
                            const char *agent,
                            const loom_agent_tool_options *opts)
{
    if (!reg || !s ||
        (opts && opts->version != LOOM_AGENT_TOOL_OPTIONS_VERSION &&
         opts->version != 0))
        return loom__error_set(LOOM_EINVALID,
                               "agent tool options: bad version or "
                               "arguments");
    return loom__agent_tool_add(reg, s, agent, opts ? opts->name : NULL,
                                opts ? opts->description : NULL,
                                opts ? opts->model : NULL,
                                opts ? opts->max_iterations : 0, 1);
}
