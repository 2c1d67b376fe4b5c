/*
 * The server's machinery, shared by server.c, http.c, runs.c, sse.c and
 * metrics.c only (endpoint files use internal.h).
 *
 * Suspension. libmicrohttpd stops watching a suspended connection: it
 * neither times it out nor notices the client leaving. Every suspended
 * connection (an SSE stream waiting for events, a request waiting for its
 * run) is therefore an srv_susp on the server's list, guarded by
 * susp_lock: the ticker thread polls their sockets for a peer that went
 * away and marks streams due for a keep-alive comment; a run's new event
 * wakes its watchers. Whoever resumes a connection takes it off the list
 * under the lock, so the ticker only ever polls sockets that
 * libmicrohttpd cannot close under it.
 */
#ifndef LOOM_SERVER_SRVPRIV_H
#define LOOM_SERVER_SRVPRIV_H

#include "loom/limits.h"
#include "loom/pool.h"
#include "loom/router.h"
#include "loom/session.h"
#include "server/internal.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

/* ---- suspension ---------------------------------------------------------- */

typedef struct srv_susp {
    struct MHD_Connection *mc;
    struct loom_server *srv; /* set by srv__run_watch, for its wakes */
    int fd;
    srv_run *run;          /* cancelled when the client goes away */
    long keepalive_ms;     /* 0: no keep-alive (deferred requests) */
    long long idle_since;  /* last bytes written, ms */
    /* Woken by run's end only, not by each of its events (a request
     * that answers once the run ended: each wake is a trip through the
     * polling thread). Set before srv__run_watch. */
    int end_only;
    /* Guarded by the server's susp_lock. */
    unsigned long long ticket; /* this suspension's number, rising */
    int suspended;
    int wake;                     /* something happened since the last look */
    struct srv_susp *prev, *next; /* on the list while suspended */
    /* Set by the ticker under susp_lock, read (and keepalive_due
     * cleared) without it: srv__susp_flags takes no lock. */
    atomic_int gone;          /* the client went away while suspended */
    atomic_int keepalive_due; /* the stream has been idle for keepalive_ms */
} srv_susp;

/*
 * Suspends s->mc unless something is pending (a wake, the server
 * closing). Returns 0 when suspended, 1 when the caller should look
 * again (a wake was pending; it is cleared), -1 when the server is
 * closing (do not suspend; end the request). Server thread only.
 */
int srv__suspend(srv_server *s, srv_susp *sp);

/* Wakes sp: resumes it if suspended, else leaves a wake for the next
 * srv__suspend. Any thread. */
void srv__wake(srv_server *s, srv_susp *sp);

/* Reads the flags the ticker set, and clears keepalive_due; lock-free
 * (a look per resumption of every waiting request and stream). */
void srv__susp_flags(srv_server *s, srv_susp *sp, int *gone,
                     int *keepalive_due);

/* The connection's socket, -1 when unknown. */
int srv__conn_fd(struct MHD_Connection *mc);

/* ---- admission (queue.c) ------------------------------------------------- */

enum {
    SRV_WAIT_NONE = 0, /* not waiting */
    SRV_WAIT_QUEUED,   /* waiting for a run slot */
    SRV_WAIT_GRANTED,  /* a slot was handed over: run the handler again */
    SRV_WAIT_EXPIRED   /* waited queue_wait_ms, or the server stops: 503 */
};

/* A request's place in the admission queue; lives in its connection.
 * Zeroed: not waiting. */
typedef struct srv_waiter {
    /* Guarded by the queue's lock. */
    int state;                        /* SRV_WAIT_* */
    srv_susp *susp;                   /* woken when granted or expired */
    long long deadline;               /* monotonic ms */
    struct srv_qid *id;               /* its caller's waiters */
    struct srv_waiter *prev, *next;   /* every waiter, oldest first */
    struct srv_waiter *iprev, *inext; /* its caller's, oldest first */
    /* Set by srv__slot_take when it queued the request, for the
     * dispatcher (server thread only). */
    int enqueued;
} srv_waiter;

typedef struct srv_queue srv_queue;
int srv__queue_new(srv_queue **out, const loom_server_config *sc);
void srv__queue_free(srv_queue *q);

/*
 * Takes a run slot for request r (NULL: a run without a request, which
 * never waits). 0: a slot is taken (a free one, or the one handed over to
 * r while it waited). SRV_EQUEUED: none is free and r now waits in the
 * queue (r's handler answers nothing; the dispatcher suspends it and runs
 * the handler again once a slot is handed over). SRV_EBUSY with a
 * message: none is free and r cannot wait (the queue or the caller's
 * share of it is full, or there is no queue).
 */
int srv__slot_take(srv_server *s, srv_request *r);
/* A run slot is free: handed over to the next waiter in turn, if any. */
void srv__slot_give(srv_server *s);
/* w stops waiting (its client left, its handler answered, it is over):
 * taken off the queue, or a slot handed over to it passed on. */
void srv__queue_leave(srv_server *s, srv_waiter *w);
/* w's SRV_WAIT_* state. */
int srv__queue_state(srv_server *s, const srv_waiter *w);
/* Expires (SRV_WAIT_EXPIRED, woken) the waiters whose queue_wait_ms is
 * over; all: every waiter (the server stops). The ticker calls it. */
void srv__queue_expire(srv_server *s, int all);

typedef struct {
    int waiting, max;
    unsigned long long refused_full, refused_identity, timed_out;
} srv_queue_stats;
void srv__queue_stats(srv_server *s, srv_queue_stats *out);

/* What the limits allow (/readyz "capacity", docs/server.md): the open
 * files limit, max_connections and max_concurrent_runs, the connections
 * and streamed runs they allow together, the queue. NULL: out of memory. */
json_t *srv__capacity_json(srv_server *s);

/* The request's waiter, and its connection's srv_susp made ready to be
 * suspended (http.c). */
srv_waiter *srv__request_waiter(srv_request *r);
srv_susp *srv__request_susp(srv_request *r);

/* ---- tasks (tasks.c) ----------------------------------------------------- */

/* sp (of server s) is woken when t finishes; unwatch before sp goes. */
void srv__task_watch(srv_task *t, srv_server *s, srv_susp *sp);
void srv__task_unwatch(srv_task *t);

/* ---- runs (runs.c) ------------------------------------------------------- */

/* A watcher of a run's event log: woken on every new event and at the
 * end. */
void srv__run_watch(srv_run *run, srv_susp *sp);
void srv__run_unwatch(srv_run *run, srv_susp *sp);

/* The server's run table. */
typedef struct srv_runs srv_runs;
int srv__runs_new(srv_runs **out, const loom_server_config *sc);
void srv__runs_free(srv_runs *rt);
/* Runs not ended yet. */
int srv__runs_active(srv_server *s);
/* The pool runs are fibers on; NULL: a thread per run. */
loom_pool *srv__runs_pool(const srv_runs *rt);
/* Waits until no run is active or deadline_ms (monotonic; < 0: forever)
 * passes. 1 when none is active. */
int srv__runs_wait_idle(srv_server *s, long long deadline_ms);
/* Cancels every active run (the server stops): a research run is
 * interrupted, to resume when the server starts again
 * (loom_turn_interrupt). */
void srv__runs_cancel_all(srv_server *s);
/* Starts again, in the background, every research run the store says
 * was running when the server last stopped (docs/research.md "Resuming
 * after a stop"). What cannot resume is logged and left for the next
 * start. */
void srv__runs_resume(srv_server *s);

/*
 * loom_session_store_retry with the server's session: retries counted in
 * loom_store_retries_total under what. For worker threads only.
 */
typedef loom_store_op_fn srv_store_op;
int srv__store_retry(srv_server *s, srv_store_op op, void *arg,
                     const char *what);

/* ---- authentication (auth.c) --------------------------------------------- */

typedef struct srv_auth srv_auth;
/* The config's auth section and admin key ($LOOM_ADMIN_KEY). */
int srv__auth_new(srv_auth **out, const loom_config *cfg);
void srv__auth_free(srv_auth *a);
/* Refuses (LOOM_EINVALID) to serve sa beyond loopback in mode none
 * unless auth.allow_unauthenticated, which is then warned about. */
struct sockaddr;
int srv__auth_check_listen(srv_server *s, const struct sockaddr *sa);
/* Authenticates r for its route into *who (r->who points at it): 1 go
 * on, 0 answered (401, 429, 500). */
int srv__auth_request(srv_request *r, srv_identity *who);
void srv__identity_clear(srv_identity *who);

/* ---- limits and budgets (limits.c) --------------------------------------- */

/*
 * A run's admission (docs/accounts.md "Limits", "Budgets"): the lease of
 * its request's limits and its call gate. Lives in the run.
 */
typedef struct srv_admission {
    srv_server *s;
    loom_limit_lease *lease; /* NULL: nothing limits the run */
    loom_call_gate gate;     /* reserve and settle against lease */
    /* For the audit log: whose key. Copied. */
    char key_id[LOOM_KEY_ID_SIZE];
    char workspace[LOOM_ACCOUNT_NAME_MAX + 1];
    char user[LOOM_ACCOUNT_NAME_MAX + 1];
    size_t nscopes;
    /* LOOM_LIMIT_SCOPES_MAX names, made by srv__admit when limits apply
     * (640 bytes a run otherwise kept, for as long as it streams);
     * freed when the admission ends. */
    char (*scopes)[LOOM_LIMIT_SCOPE_SIZE];
    /* Written by the run's thread, read once it ended. */
    atomic_int granted; /* calls let through */
    atomic_int refused; /* calls refused by a budget */
} srv_admission;

/* Sets up a's gate (before the turn is made, whose options point at
 * it); nothing is admitted yet. */
void srv__admission_init(srv_admission *a, srv_server *s);

/*
 * Admits the run of spec (its model: model) for its caller: the limits
 * of its API key, the key's user and workspace (nothing for a caller
 * without a key). Sets the x-ratelimit-* headers on spec->request's
 * answer. 0 and a->lease (may stay NULL); else SRV_ERATE_REQUESTS,
 * SRV_ERATE_TOKENS (Retry-After set), SRV_EQUOTA, SRV_EUNPRICED, or the
 * store's error, with a message.
 */
int srv__admit(srv_admission *a, const srv_run_spec *spec, const char *model);

/* Ends the admission: its concurrent-run slots are free. Again, or for
 * an admission never made, it only frees what is left. */
void srv__admission_release(srv_admission *a);

/* ---- the server (server.c) ----------------------------------------------- */

typedef struct {
    char *name;
    loom_provider *p; /* the metrics wrapper around the real provider */
} srv_provider_entry;

/* srv_provider as a loom_provider_lookup_fn (payload: the server). */
loom_provider *srv__provider_lookup(const char *provider, void *payload);

typedef struct srv_metrics srv_metrics;

struct loom_server {
    const loom_config *cfg;
    const loom_server_config *sc;
    loom_store *store;
    const loom_tool_registry *tools; /* the session's */
    /* Every run is a turn of this session (loom/session.h). */
    loom_session *session;
    srv_provider_entry *providers;
    size_t nproviders;
    /* Which deployments are failing or cooling down, shared by every
     * run's router (loom/router.h). */
    loom_router_health *health;
    char *listen;
    int offline_demo; /* loom_server_options.offline_demo */
    loom_mcp_set *mcp_servers; /* loom_server_options.mcp_servers */
    /* Users' MCP accounts being connected (api_mcp.c); server thread. */
    struct srv_mcp_flows *mcp_flows;
    struct MHD_Daemon *d;
    int port;
    srv_router *router;
    srv_auth *auth;
    loom_limiter *limiter; /* limits and budgets (limits.c) */
    srv_runs *runs;
    srv_queue *queue; /* run slots and the admission queue */
    srv_metrics *metrics;
    /* libmicrohttpd's connection timeouts, seconds: until the request's
     * headers are in, then after them. */
    unsigned header_timeout_s, read_timeout_s;
    /* What the limits allow, worked out at start (loom_server_start). */
    long fd_limit;
    int cap_connections, cap_streams;
    atomic_int draining;  /* stopping: new runs are refused (503) */
    atomic_int closing;   /* suspended requests end instead of waiting */
    atomic_int stopped;   /* loom_server_stop() ran */
    atomic_int streams;   /* SSE streams open */
    /* Requests handled and not completed (waiting for a run, streaming,
     * sending their answer): the stop waits for them. */
    atomic_int pending;
    /* suspended connections */
    pthread_mutex_t susp_lock;
    srv_susp *susp_head; /* newest first */
    size_t nsusp;
    unsigned long long susp_tickets; /* suspensions so far */
    /* the ticker */
    pthread_t ticker;
    int ticker_started;
    pthread_mutex_t tick_lock;
    pthread_cond_t tick_cv;
    int tick_stop;
    /* loom_server_wait / request_stop */
    int stop_pipe[2];
    /* libmicrohttpd's loop on a worker of the run pool (server.c), NULL
     * when it has a thread of its own; read and cleared under susp_lock.
     * http_quiesce: 1 asked, 2 done (http_lock and http_cv), http_lfd
     * the listening socket then. */
    loom_pool_loop *http_loop;
    atomic_int http_quiesce;
    pthread_mutex_t http_lock;
    pthread_cond_t http_cv;
    int http_lfd;
    /* Request contexts kept for reuse (http.c); polling thread only. */
    struct srv_conn *conn_spare;
    int nconn_spare;
};

long long srv__now_ms(void);

/* ---- http.c -------------------------------------------------------------- */

int srv__router_new(srv_router **out);
void srv__router_free(srv_router *rt);

/* libmicrohttpd callbacks (cls is the server). */
enum MHD_Result srv__on_request(void *cls, struct MHD_Connection *mc,
                                const char *url, const char *method,
                                const char *version, const char *upload,
                                size_t *upload_size, void **con_cls);
void srv__on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                       enum MHD_RequestTerminationCode toe);

/* Frees the request contexts kept for reuse (once the daemon stopped). */
void srv__conn_spares_free(srv_server *s);

/* Queues resp with the request's pending headers (http.c). Takes resp. */
int srv__queue(srv_request *r, unsigned status, struct MHD_Response *resp);

/* The libmicrohttpd connection of a request. */
struct MHD_Connection *srv__request_mc(srv_request *r);

/* Marks the request as streaming (sse.c hands over its stream so the
 * completion callback can tell it the request is over). */
struct srv_sse_stream;
void srv__request_set_stream(srv_request *r, struct srv_sse_stream *st);
/* Called by http.c when a streamed request is over; ok: completed
 * normally. */
void srv__sse_request_done(struct srv_sse_stream *st, int ok);

/* ---- metrics.c ----------------------------------------------------------- */

int srv__metrics_new(srv_metrics **out);
void srv__metrics_free(srv_metrics *m);
void srv__metrics_request(srv_metrics *m, const char *method,
                          const char *route, unsigned status, double secs);
void srv__metrics_run(srv_metrics *m, const char *status, double secs);
void srv__metrics_upstream(srv_metrics *m, const char *provider, double secs,
                           const char *error_kind);
void srv__metrics_tool(srv_metrics *m, const char *tool, const char *outcome);
/* A run's count of a tool abandoned after its error (loom/run.h). */
void srv__metrics_tools_abandoned(srv_metrics *m, const char *tool, long n);
/* A store call that failed for good (op: "save_turn",
 * "create_conversation", "load_history"), or is retried. */
void srv__metrics_store_error(srv_metrics *m, const char *op);
void srv__metrics_store_retry(srv_metrics *m, const char *op);
void srv__metrics_tokens(srv_metrics *m, const char *model, const char *kind,
                         long n);
/* Micro-dollars a priced model call cost; micros < 0 (unknown) adds
 * nothing. */
void srv__metrics_cost(srv_metrics *m, const char *model, long long micros);
/* The Prometheus text exposition; caller frees. */
char *srv__metrics_render(srv_server *s);

/* Wraps inner (taking it) so every call is measured. */
int srv__metrics_provider(loom_provider **out, srv_metrics *m,
                          loom_provider *inner);

/* Arms fault point (see srv__fault) to fail its next count calls; NULL
 * disarms. Process-wide: for tests, which run one at a time. */
void srv__fault_arm(const char *point, int count);

/* ---- endpoint files ------------------------------------------------------ */

int srv__api_runs_routes(srv_router *rt);
int srv__api_misc_routes(srv_router *rt);
int srv__api_admin_routes(srv_router *rt);
int srv__api_settings_routes(srv_router *rt);
/* The web UI's routes (ui.c), unless sc->ui is 0 or the build has none. */
int srv__ui_routes(srv_router *rt, const loom_server_config *sc);
/* 1 for a path of the web UI, which needs no key (ui.c). */
int srv__ui_public(const char *path);
int srv__api_usage_routes(srv_router *rt);
/* Users' own MCP accounts (api_mcp.c): the routes; 1 for the path the
 * authorization server sends browsers back to, which needs no key; the
 * flows under way ended (their threads joined), at the server's free. */
int srv__api_mcp_routes(srv_router *rt);
int srv__mcp_public(const char *path);
void srv__mcp_flows_free(srv_server *s);
/* For tests: how long connections started from now on wait for the
 * browser (< 0: the default, 10 minutes; 0: they expire at once). */
void srv__mcp_flow_ttl_set(long ms);

#endif
