/*
 * The server's life: building it from a config (providers, router, run
 * table, metrics), starting libmicrohttpd, the ticker thread, suspension
 * of connections, and the graceful stop.
 *
 * libmicrohttpd polls its connections with epoll, from one of the run
 * pool's workers (http_step, below) when runs are fibers, else on
 * an internal thread of its own; either way one polling thread (the
 * "polling thread" of these files) answers every connection, so a
 * thousand idle SSE streams cost a thousand sockets, not a thousand
 * threads. A connection that waits (for a run's next event, or for its
 * end) is suspended; libmicrohttpd then ignores it entirely, so the
 * ticker (every LOOK_TICKS * TICK_MS) polls the sockets of suspended
 * connections for a client that went away (a disconnect cancels the run
 * within that look) and wakes idle streams that owe a keep-alive
 * comment. See srvpriv.h for the locking rules.
 *
 * Slow clients. A connection gets header_timeout_ms to send its request's
 * headers (http.c lifts it to read_timeout_ms once they are in), one
 * address holds at most max_connections_per_address connections, and
 * max_connections may be tens of thousands (epoll): one client holding
 * thousands of half-open connections then keeps neither others out nor
 * /healthz and /metrics from answering. At start the server works out
 * how many connections and streamed runs its limits allow (the open
 * files limit against max_connections and max_concurrent_runs), logs it
 * and shows it in /readyz.
 *
 * Stop: quiesce (close the listening socket), refuse new runs, give
 * running runs shutdown_grace_ms to finish, cancel the rest and wait for
 * them to store their turns, then wait for every request that was being
 * handled (blocking requests waiting for their run, streams, answers
 * still being sent) to complete, so each gets its whole answer; only
 * then end whatever is still suspended and stop the daemon.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/log.h"
#include "loom/memory.h"
#include "server/srvpriv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 20
/* The suspended connections are looked at every LOOK_TICKS ticks (100 ms):
 * one poll of every waiting socket costs about half a microsecond each,
 * so at 10,000 open streams a look every tick took a fifth of a core
 * (bench/serve/README.md); a client that left is still noticed within a
 * tenth of a second. */
#define LOOK_TICKS 5
#define STREAM_DRAIN_MS 3000      /* requests flush after the runs ended */
/* Descriptors that are not client connections: the store, the log, the
 * listening socket, epoll, pipes, MCP servers' and tools' sockets. */
#define FD_RESERVE 64

/* Kept for runs.c until its rewrite lands: new code calls loom__mono_ms. */
long long srv__now_ms(void)
{
    return loom__mono_ms();
}

/* ---- test hooks ---------------------------------------------------------- */

static _Atomic(const char *) fault_point;
static atomic_int fault_left;

void srv__fault_arm(const char *point, int count)
{
    atomic_store(&fault_point, NULL);
    atomic_store(&fault_left, count);
    atomic_store(&fault_point, point);
}

int srv__fault(const char *point)
{
    const char *armed = atomic_load(&fault_point);

    if (!armed || strcmp(armed, point) != 0 ||
        atomic_fetch_sub(&fault_left, 1) <= 0)
        return 0;
    return loom__error_set(LOOM_ENOMEM, "fault injected at %s", point);
}

/* ---- accessors ----------------------------------------------------------- */

const loom_config *srv_config(const srv_server *s)
{
    return s->cfg;
}

loom_store *srv_store(const srv_server *s)
{
    return s->store;
}

const loom_tool_registry *srv_tools(const srv_server *s)
{
    return s->tools;
}

loom_provider *srv__provider_lookup(const char *provider, void *payload)
{
    return srv_provider(payload, provider);
}

loom_provider *srv_provider(srv_server *s, const char *name)
{
    for (size_t i = 0; name && i < s->nproviders; i++)
        if (strcmp(s->providers[i].name, name) == 0)
            return s->providers[i].p;
    return NULL;
}

int srv_model(srv_server *s, const char *name, const loom_model_config **out,
              loom_model_config *tmp)
{
    return loom_config_model(out, tmp, s->cfg, name);
}

const loom_agent_config *srv_agent(const srv_server *s, const char *name)
{
    if (!name)
        name = s->cfg->default_agent;
    return name ? loom_config_agent(s->cfg, name) : NULL;
}

const char *srv_default_model(srv_server *s, const loom_agent_config *agent)
{
    return loom_session_default_model(s->session, agent);
}

loom_session *srv_session(const srv_server *s)
{
    return s->session;
}

/* ---- suspension ---------------------------------------------------------- */

int srv__conn_fd(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);

    return ci ? ci->connect_fd : -1;
}

/* Takes sp off the list and resumes it. susp_lock held. */
static void resume_locked(srv_server *s, srv_susp *sp)
{
    if (!sp->suspended)
        return;
    if (sp->prev)
        sp->prev->next = sp->next;
    else
        s->susp_head = sp->next;
    if (sp->next)
        sp->next->prev = sp->prev;
    sp->prev = sp->next = NULL;
    sp->suspended = 0;
    s->nsusp--;
    MHD_resume_connection(sp->mc);
    /* libmicrohttpd signals nothing in its external mode: the loop that
     * runs it is told here that a connection is due. */
    if (s->http_loop)
        loom_pool_loop_wake(s->http_loop);
}

int srv__suspend(srv_server *s, srv_susp *sp)
{
    int rc = 0;

    pthread_mutex_lock(&s->susp_lock);
    if (atomic_load(&s->closing)) {
        rc = -1;
    } else if (sp->wake) {
        sp->wake = 0;
        rc = 1;
    } else {
        sp->suspended = 1;
        sp->ticket = ++s->susp_tickets;
        sp->prev = NULL;
        sp->next = s->susp_head;
        if (s->susp_head)
            s->susp_head->prev = sp;
        s->susp_head = sp;
        s->nsusp++;
        MHD_suspend_connection(sp->mc);
    }
    pthread_mutex_unlock(&s->susp_lock);
    return rc;
}

void srv__wake(srv_server *s, srv_susp *sp)
{
    pthread_mutex_lock(&s->susp_lock);
    sp->wake = 1;
    resume_locked(s, sp);
    pthread_mutex_unlock(&s->susp_lock);
}

void srv__susp_flags(srv_server *s, srv_susp *sp, int *gone,
                     int *keepalive_due)
{
    (void)s;
    if (gone)
        *gone = atomic_load(&sp->gone);
    if (keepalive_due)
        *keepalive_due = atomic_exchange(&sp->keepalive_due, 0);
}

/* Resumes every suspended connection (at stop, after closing is set). */
static void resume_all(srv_server *s)
{
    pthread_mutex_lock(&s->susp_lock);
    while (s->susp_head)
        resume_locked(s, s->susp_head);
    pthread_mutex_unlock(&s->susp_lock);
}

/* Makes room for n sockets to poll and their suspensions' tickets in
 * the ticker's arrays. 0, or -1 when out of memory. */
static int tick_room(struct pollfd **pfd, unsigned long long **ent, size_t *cap,
                     size_t n)
{
    size_t c = n * 2;
    struct pollfd *np;
    unsigned long long *ne;

    if (n <= *cap)
        return 0;
    if (!(np = realloc(*pfd, c * sizeof(*np))))
        return -1;
    *pfd = np;
    if (!(ne = realloc(*ent, c * sizeof(*ne))))
        return -1;
    *ent = ne;
    *cap = c;
    return 0;
}

/*
 * One look at the suspended connections: a socket whose peer closed its
 * side (or failed) is a client that went away; a stream idle for its
 * keep-alive interval is woken to send a comment.
 *
 * The sockets are polled without susp_lock, which every wake and
 * suspension takes: with thousands of streams a poll takes a millisecond
 * or more, and each chunk of every stream would wait for it. What is
 * polled is noted under the lock first (each suspension's ticket, newest
 * first, as on the list); afterwards, under the lock again, only a
 * connection still in the same suspension is looked at. A socket is
 * never closed while its connection is suspended, so for those the
 * answer is about that socket; one resumed meanwhile (its socket perhaps
 * closed, its number reused) is no longer on the list or has a new
 * ticket, and what poll said of it is dropped. Resuming keeps the order
 * of the list and new suspensions go to its head, so one walk of each
 * pairs them.
 */
static void tick(srv_server *s, struct pollfd **pfd, unsigned long long **ent,
                 size_t *cap)
{
    unsigned long long newest;
    long long now;
    size_t n = 0, i = 0;
    srv_susp *next;

    pthread_mutex_lock(&s->susp_lock);
    if (tick_room(pfd, ent, cap, s->nsusp) != 0) {
        pthread_mutex_unlock(&s->susp_lock);
        return; /* out of memory: try again next tick */
    }
    for (srv_susp *sp = s->susp_head; sp; sp = sp->next) {
        (*pfd)[n].fd = sp->fd;
        (*pfd)[n].events = POLLRDHUP;
        (*pfd)[n].revents = 0;
        (*ent)[n++] = sp->ticket;
    }
    newest = s->susp_tickets;
    pthread_mutex_unlock(&s->susp_lock);
    if (n && poll(*pfd, n, 0) < 0)
        for (size_t k = 0; k < n; k++)
            (*pfd)[k].revents = 0;
    pthread_mutex_lock(&s->susp_lock);
    now = loom__mono_ms();
    for (srv_susp *sp = s->susp_head; sp; sp = next) {
        short rev = 0;
        next = sp->next;
        if (sp->ticket > newest)
            continue; /* suspended since: the next tick looks */
        while (i < n && (*ent)[i] != sp->ticket)
            i++;
        if (i < n)
            rev = (*pfd)[i++].revents;
        if (rev & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
            atomic_store(&sp->gone, 1);
            if (sp->run)
                srv_run_leave(sp->run);
            resume_locked(s, sp);
        } else if (sp->keepalive_ms > 0 &&
                   now - sp->idle_since >= sp->keepalive_ms) {
            atomic_store(&sp->keepalive_due, 1);
            resume_locked(s, sp);
        }
    }
    pthread_mutex_unlock(&s->susp_lock);
}

static void *ticker_main(void *arg)
{
    srv_server *s = arg;
    struct pollfd *pfd = NULL;
    unsigned long long *ent = NULL;
    size_t cap = 0;
    struct timespec ts;
    unsigned ticks = 0;

    pthread_mutex_lock(&s->tick_lock);
    while (!s->tick_stop) {
        pthread_mutex_unlock(&s->tick_lock);
        if (ticks++ % LOOK_TICKS == 0)
            tick(s, &pfd, &ent, &cap);
        srv__queue_expire(s, 0);
        pthread_mutex_lock(&s->tick_lock);
        if (s->tick_stop)
            break;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->tick_cv, &s->tick_lock, &ts);
    }
    pthread_mutex_unlock(&s->tick_lock);
    free(pfd);
    free(ent);
    return NULL;
}

/* ---- building ------------------------------------------------------------ */

/* libmicrohttpd's own complaints go to loom's log, never to stderr. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    size_t n;

    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    loom_debug("microhttpd: %s", msg);
}

static void observe_store_retry(const char *op, void *payload)
{
    srv__metrics_store_retry(((srv_server *)payload)->metrics, op);
}

static void observe_store_error(const char *op, void *payload)
{
    srv__metrics_store_error(((srv_server *)payload)->metrics, op);
}

/*
 * The session every run is a turn of: the config, the store, the tools
 * (the caller's, else built-ins, the config's and the memory tools: the
 * server has the store, so its runs may remember for users), every
 * router sharing the server's adapters and failure record.
 */
static int build_session(srv_server *s, const loom_server_options *opts)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    int rc;

    so.config = s->cfg;
    so.tools = opts->tools;
    so.store = s->store;
    so.health = s->health;
    so.lookup = srv__provider_lookup;
    so.lookup_payload = s;
    so.store_retry_ms = SRV_STORE_RETRY_MS;
    so.observer.store_retry = observe_store_retry;
    so.observer.store_error = observe_store_error;
    so.observer.payload = s;
    if ((rc = loom_session_new(&s->session, &so)) != 0)
        return rc;
    s->tools = loom_session_tools(s->session);
    return 0;
}

static int build_providers(srv_server *s)
{
    const loom_config *c = s->cfg;
    int rc;

    if (!c->providers_len)
        return 0;
    s->providers = calloc(c->providers_len, sizeof(*s->providers));
    if (!s->providers)
        return loom__error_oom();
    for (size_t i = 0; i < c->providers_len; i++) {
        loom_provider *p = NULL;
        srv_provider_entry *e = &s->providers[s->nproviders];
        if ((rc = loom_provider_new(&p, &c->providers[i])) != 0)
            return rc;
        if (!(e->name = strdup(c->providers[i].name))) {
            loom_provider_free(p);
            return loom__error_oom();
        }
        if ((rc = srv__metrics_provider(&e->p, s->metrics, p)) != 0) {
            free(e->name);
            return rc;
        }
        s->nproviders++;
    }
    return 0;
}

int loom_server_new(loom_server **out, const loom_server_options *opts)
{
    srv_server *s = NULL;
    const char *listen;
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "loom_server_new: NULL out");
    *out = NULL;
    if (!opts || !opts->config || !opts->store)
        return loom__error_set(LOOM_EINVALID,
                               "loom_server_new: a config and a store are "
                               "required");
    if (opts->version != LOOM_SERVER_OPTIONS_VERSION && opts->version != 0)
        return loom__error_set(LOOM_EINVALID,
                               "loom_server_new: bad options version");
    if (!(s = calloc(1, sizeof(*s))))
        return loom__error_oom();
    s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->http_lfd = -1;
    pthread_mutex_init(&s->http_lock, NULL);
    pthread_cond_init(&s->http_cv, NULL);
    pthread_mutex_init(&s->susp_lock, NULL);
    pthread_mutex_init(&s->tick_lock, NULL);
    {
        /* The ticker's deadlines are on the monotonic clock: the condition
         * variable must wait on the same clock, or every wait returns at
         * once and the ticker spins. */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&s->tick_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    s->cfg = opts->config;
    s->sc = &opts->config->server;
    s->store = opts->store;
    s->offline_demo = opts->offline_demo != 0;
    s->mcp_servers = opts->mcp_servers;
    listen = opts->listen ? opts->listen : s->sc->listen;
    if (!listen)
        listen = LOOM_SERVER_DEFAULT_LISTEN;
    if (!(s->listen = strdup(listen))) {
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = srv__metrics_new(&s->metrics)) != 0 ||
        (rc = build_providers(s)) != 0 ||
        (rc = loom_router_health_new(&s->health)) != 0 ||
        (rc = build_session(s, opts)) != 0 ||
        (rc = srv__runs_new(&s->runs, s->sc)) != 0 ||
        (rc = srv__queue_new(&s->queue, s->sc)) != 0 ||
        (rc = srv__router_new(&s->router)) != 0 ||
        (rc = srv__auth_new(&s->auth, s->cfg)) != 0 ||
        (rc = loom_limiter_new(&s->limiter, s->store)) != 0 ||
        (rc = srv__api_admin_routes(s->router)) != 0 ||
        (rc = srv__api_settings_routes(s->router)) != 0 ||
        (rc = srv__api_usage_routes(s->router)) != 0 ||
        (rc = srv__api_mcp_routes(s->router)) != 0 ||
        (rc = srv__api_runs_routes(s->router)) != 0 ||
        (rc = srv__api_misc_routes(s->router)) != 0 ||
        (rc = srv__ui_routes(s->router, s->sc)) != 0)
        goto fail;
    srv_chat_routes(s->router);
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = loom__error_set(LOOM_EIO, "pipe: %s", strerror(errno));
        goto fail;
    }
    *out = s;
    return 0;

fail:
    loom_server_free(s);
    return rc;
}

/* "HOST:PORT" into a socket address. */
static int parse_listen(const char *listen, struct sockaddr_storage *ss,
                        socklen_t *len, int *v6)
{
    const char *colon = strrchr(listen, ':');
    char host[256], *end;
    long port;
    size_t hl;

    memset(ss, 0, sizeof(*ss));
    *v6 = 0;
    if (!colon || colon == listen)
        goto bad;
    hl = (size_t)(colon - listen);
    if (hl >= sizeof(host))
        goto bad;
    memcpy(host, listen, hl);
    host[hl] = '\0';
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end || errno || port < 0 ||
        port > 65535)
        goto bad;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        host[hl - 1] = '\0';
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            goto bad;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        *len = sizeof(*a);
        *v6 = 1;
        return 0;
    }
    {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        *len = sizeof(*a);
        if (!strcmp(host, "localhost"))
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        else if (!strcmp(host, "*"))
            a->sin_addr.s_addr = htonl(INADDR_ANY);
        else if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            goto bad;
    }
    return 0;

bad:
    return loom__error_set(LOOM_EINVALID,
                           "listen address '%s' is not HOST:PORT (an IPv4 "
                           "address, localhost, * or [IPv6], and a port "
                           "0..65535)",
                           listen);
}

int loom_server_raise_fd_limit(long *limit)
{
    struct rlimit rl;

    if (limit)
        *limit = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return loom__error_set(LOOM_EIO, "getrlimit: %s", strerror(errno));
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        /* Some systems refuse RLIM_INFINITY for open files: the limit
         * then stays what it was. */
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 &&
            getrlimit(RLIMIT_NOFILE, &rl) != 0)
            return loom__error_set(LOOM_EIO, "getrlimit: %s", strerror(errno));
    }
    if (limit)
        *limit = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
    return 0;
}

/*
 * What the limits allow: each connection is a descriptor, and a streamed
 * run holds two (its client's and its upstream's). Logged, with a
 * warning when the open files limit is the one that binds.
 */
static void work_out_capacity(srv_server *s)
{
    struct rlimit rl;
    long fds = -1, usable;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fds = (long)rl.rlim_cur;
    s->fd_limit = fds;
    usable =
        fds < 0 ? 2L * s->sc->max_connections + FD_RESERVE : fds - FD_RESERVE;
    if (usable < 2)
        usable = 2;
    s->cap_connections =
        s->sc->max_connections < usable ? s->sc->max_connections : (int)usable;
    s->cap_streams = s->sc->max_concurrent_runs < s->cap_connections
                         ? s->sc->max_concurrent_runs
                         : s->cap_connections;
    if (s->cap_streams > usable / 2)
        s->cap_streams = (int)(usable / 2);
    loom_info("limits allow %d connections at once (max_connections %d, "
              "%d from one address, open files %ld) and %d streamed runs "
              "(max_concurrent_runs %d, %d more may wait)",
              s->cap_connections, s->sc->max_connections,
              s->sc->max_connections_per_address, fds, s->cap_streams,
              s->sc->max_concurrent_runs,
              s->sc->queue_wait_ms > 0 ? s->sc->queue_max : 0);
    if (s->cap_connections < s->sc->max_connections ||
        s->cap_streams < s->sc->max_concurrent_runs)
        loom_warn("the open files limit (%ld) allows fewer connections or "
                  "streamed runs than configured: raise it (ulimit -n, "
                  "LimitNOFILE=) or lower max_connections",
                  fds);
}

json_t *srv__capacity_json(srv_server *s)
{
    srv_queue_stats qs;

    srv__queue_stats(s, &qs);
    return json_pack("{s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "open_files",
                     (json_int_t)s->fd_limit, "max_connections",
                     s->sc->max_connections, "max_connections_per_address",
                     s->sc->max_connections_per_address, "connections",
                     s->cap_connections, "max_concurrent_runs",
                     s->sc->max_concurrent_runs, "streams", s->cap_streams,
                     "queue_max", qs.max, "queued", qs.waiting);
}

/* libmicrohttpd counts its timeouts in whole seconds: ms rounded up. */
static unsigned whole_seconds(long ms)
{
    unsigned sec = (unsigned)((ms + 999) / 1000);

    return sec < 1 ? 1 : sec;
}

/* libmicrohttpd's pool per connection, in bytes (a config made without
 * the loader's defaults gets 32 KiB). libmicrohttpd 0.9.75 mallocs a pool
 * of up to 32 KiB (mmaps a larger one) and zeroes all of it after every
 * request of a keep-alive connection, so all of it is resident from the
 * second request on: this is most of what an idle connection costs. */
static size_t conn_memory(const loom_server_config *sc)
{
    return (size_t)(sc->connection_memory_kb > 0 ? sc->connection_memory_kb
                                                 : 32) *
           1024;
}

/* ---- libmicrohttpd on a worker ------------------------------------------ */

/*
 * With runs on fibers, libmicrohttpd has no thread of its own: the run
 * pool drives it from one of its workers (loom_pool_loop_start), so at
 * one request at a time the request is read, its run started on the same
 * worker, the model called and the answer written without a thread
 * hand-off. With its own polling thread each request woke a sleeping
 * thread twice (a worker for the run, the daemon's thread for the
 * answer): on a virtual machine tens of microseconds each
 * (bench/serve/README.md). The daemon is in its external epoll mode,
 * whose resumes signal nothing: resume_locked wakes the loop. Its step
 * (MHD_run) runs on the worker's own stack, so request handlers do as on
 * the daemon's thread before (jansson parsing a body at its depth limit
 * needs more stack than a fiber has). The stop has the step quiesce the
 * daemon (nothing else may touch it meanwhile), and stops the daemon
 * itself once the loop has ended.
 */
/* MHD_run calls a step makes at most, accepting connections. */
#define HTTP_RUNS_MAX 16

static unsigned http_connections(srv_server *s)
{
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);

    return di ? di->num_connections : 0;
}

static long http_step(void *arg)
{
    srv_server *s = arg;
    MHD_UNSIGNED_LONG_LONG ms;

    if (atomic_load(&s->http_quiesce) == 1) {
        s->http_lfd = MHD_quiesce_daemon(s->d);
        pthread_mutex_lock(&s->http_lock);
        atomic_store(&s->http_quiesce, 2);
        pthread_cond_broadcast(&s->http_cv);
        pthread_mutex_unlock(&s->http_lock);
    }
    /* libmicrohttpd accepts at most ten connections a run: while a run
     * accepted that many, more may wait in the listening queue, and the
     * next step could be a whole round of the worker's runs away (a burst
     * of thousands of streams otherwise waits for its accepts past the
     * header timeout). */
    for (int i = 0; i < HTTP_RUNS_MAX; i++) {
        unsigned before = http_connections(s);
        MHD_run(s->d);
        if (http_connections(s) < before + 10)
            break;
    }
    if (MHD_get_timeout(s->d, &ms) != MHD_YES)
        return -1;
    return ms > (MHD_UNSIGNED_LONG_LONG)LONG_MAX ? LONG_MAX : (long)ms;
}

/* Quiesces the daemon on its loop; its listening socket (or
 * MHD_INVALID_SOCKET). */
static MHD_socket http_quiesce(srv_server *s)
{
    atomic_store(&s->http_quiesce, 1);
    loom_pool_loop_wake(s->http_loop);
    pthread_mutex_lock(&s->http_lock);
    while (atomic_load(&s->http_quiesce) != 2)
        pthread_cond_wait(&s->http_cv, &s->http_lock);
    pthread_mutex_unlock(&s->http_lock);
    return s->http_lfd;
}

/* Ends the loop (no-op without one): the daemon is the caller's after. */
static void http_loop_end(srv_server *s)
{
    loom_pool_loop *l;

    pthread_mutex_lock(&s->susp_lock);
    l = s->http_loop;
    s->http_loop = NULL;
    pthread_mutex_unlock(&s->susp_lock);
    loom_pool_loop_stop(l);
}

int loom_server_start(loom_server *s)
{
    struct sockaddr_storage ss;
    socklen_t slen;
    const union MHD_DaemonInfo *di;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    loom_pool *pool;
    int v6, rc;

    if (s->d)
        return loom__error_set(LOOM_EINVALID, "server already started");
    if ((rc = parse_listen(s->listen, &ss, &slen, &v6)) != 0 ||
        (rc = srv__auth_check_listen(s, (const struct sockaddr *)&ss)) != 0)
        return rc;
    (void)slen;
    if (v6)
        flags |= MHD_USE_IPv6;
    pool = srv__runs_pool(s->runs);
    if (pool)
        flags &= ~(unsigned)MHD_USE_INTERNAL_POLLING_THREAD;
    /* Every connection starts with the header timeout (never longer than
     * the read timeout); http.c lifts it once the headers are in. */
    s->read_timeout_s = whole_seconds(s->sc->read_timeout_ms);
    s->header_timeout_s = whole_seconds(s->sc->header_timeout_ms);
    if (s->header_timeout_s > s->read_timeout_s)
        s->header_timeout_s = s->read_timeout_s;
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, srv__on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_TIMEOUT,
        s->header_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->sc->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)s->sc->max_connections_per_address,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, conn_memory(s->sc),
        MHD_OPTION_NOTIFY_COMPLETED, srv__on_completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!s->d)
        return loom__error_set(LOOM_EIO, "cannot listen on %s: %s",
                               s->listen, strerror(errno ? errno : EADDRINUSE));
    di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : 0;
    if (pool) {
        di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
        if (!di)
            rc = loom__error_set(LOOM_ERROR, "libmicrohttpd gave no epoll "
                                             "descriptor");
        else
            rc = loom_pool_loop_start(&s->http_loop, pool, di->epoll_fd,
                                      http_step, s);
        if (rc != 0) {
            MHD_stop_daemon(s->d);
            s->d = NULL;
            return rc;
        }
    }
    if (pthread_create(&s->ticker, NULL, ticker_main, s) != 0) {
        http_loop_end(s);
        MHD_stop_daemon(s->d);
        s->d = NULL;
        return loom__error_set(LOOM_ERROR, "cannot start the ticker thread");
    }
    s->ticker_started = 1;
    loom_info("listening on http://%s (port %d)", s->listen, s->port);
    work_out_capacity(s);
    srv__runs_resume(s);
    return 0;
}

int loom_server_port(const loom_server *s)
{
    return s ? s->port : 0;
}

void loom_server_request_stop(loom_server *s)
{
    ssize_t w;

    if (s && s->stop_pipe[1] >= 0)
        w = write(s->stop_pipe[1], "x", 1);
    (void)w;
}

void loom_server_wait(loom_server *s)
{
    struct pollfd p;
    char c;

    p.fd = s->stop_pipe[0];
    p.events = POLLIN;
    for (;;) {
        if (poll(&p, 1, -1) > 0 && read(s->stop_pipe[0], &c, 1) == 1)
            return;
        if (errno != EINTR && errno != EAGAIN)
            return;
    }
}

void loom_server_stop(loom_server *s)
{
    long long deadline, flush;
    MHD_socket lfd;

    if (!s || !s->d || atomic_exchange(&s->stopped, 1))
        return;
    /*
     * The listening socket is shut down now, so new clients are refused
     * at once, but closed only after the daemon stops: its polling thread
     * may still be taking it out of its epoll set, and a descriptor closed
     * under it could be reused by another thread meanwhile (TSan saw the
     * race).
     */
    lfd = s->http_loop ? http_quiesce(s) : MHD_quiesce_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET)
        shutdown(lfd, SHUT_RDWR);
    atomic_store(&s->draining, 1);
    /* Requests waiting for a run slot will not get one: 503 now. */
    srv__queue_expire(s, 1);
    loom_info("stopping: %d runs in flight, %ld ms to finish",
              srv__runs_active(s), s->sc->shutdown_grace_ms);
    deadline = loom__mono_ms() + s->sc->shutdown_grace_ms;
    if (!srv__runs_wait_idle(s, deadline)) {
        loom_warn("stopping: cancelling %d runs still in flight",
                  srv__runs_active(s));
        srv__runs_cancel_all(s);
        while (!srv__runs_wait_idle(s, loom__mono_ms() + 5000))
            loom_warn("stopping: waiting for %d cancelled runs to end",
                      srv__runs_active(s));
    }
    /*
     * Every run has ended and woken its waiters: blocking requests get
     * their answers, streams their last events. Wait until each request
     * being handled has completed (the polling thread resumes and answers
     * them meanwhile), until the grace ends or at least STREAM_DRAIN_MS.
     */
    flush = loom__mono_ms() + STREAM_DRAIN_MS;
    if (flush < deadline)
        flush = deadline;
    while (atomic_load(&s->pending) > 0 && loom__mono_ms() < flush)
        usleep(10 * 1000);
    if (atomic_load(&s->pending) > 0)
        loom_warn("stopping: %d requests still unanswered are cut",
                  atomic_load(&s->pending));
    atomic_store(&s->closing, 1);
    resume_all(s);
    http_loop_end(s);
    MHD_stop_daemon(s->d);
    s->d = NULL;
    if (lfd != MHD_INVALID_SOCKET)
        close(lfd);
    if (s->ticker_started) {
        pthread_mutex_lock(&s->tick_lock);
        s->tick_stop = 1;
        pthread_cond_signal(&s->tick_cv);
        pthread_mutex_unlock(&s->tick_lock);
        pthread_join(s->ticker, NULL);
        s->ticker_started = 0;
    }
    loom_info("stopped");
}

void loom_server_free(loom_server *s)
{
    if (!s)
        return;
    loom_server_stop(s);
    srv__mcp_flows_free(s);
    if (s->runs) {
        /* Runs that started are over (stop waited); none is left
         * running unless the server never started. */
        srv__runs_cancel_all(s);
        srv__runs_wait_idle(s, -1);
        srv__runs_free(s->runs);
    }
    srv__conn_spares_free(s);
    srv__queue_free(s->queue);
    srv__router_free(s->router);
    srv__auth_free(s->auth);
    loom_limiter_free(s->limiter);
    for (size_t i = 0; i < s->nproviders; i++) {
        loom_provider_free(s->providers[i].p);
        free(s->providers[i].name);
    }
    free(s->providers);
    /* A tool call that a run abandoned at its timeout holds its own
     * reference on the registry: the session lets go of its at once. */
    loom_session_free(s->session);
    loom_router_health_free(s->health);
    srv__metrics_free(s->metrics);
    if (s->stop_pipe[0] >= 0)
        close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0)
        close(s->stop_pipe[1]);
    pthread_mutex_destroy(&s->http_lock);
    pthread_cond_destroy(&s->http_cv);
    pthread_mutex_destroy(&s->susp_lock);
    pthread_mutex_destroy(&s->tick_lock);
    pthread_cond_destroy(&s->tick_cv);
    free(s->listen);
    free(s);
}
