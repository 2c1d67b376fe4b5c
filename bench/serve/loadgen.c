/*
 * loadgen: the load generator of bench/serve.sh. It sends OpenAI Chat
 * Completions requests to one or more HTTP targets (the fake upstream
 * directly, `loom serve` in front of it, the Portkey gateway in front of
 * it) and reports, per target, the latency of whole responses, the time
 * to the first content chunk of streamed ones, and throughput; the first
 * target is the baseline that the others' "added" figures are taken
 * against, all from one process on one clock.
 *
 * Why it is hand-written instead of libcurl, wrk or a Node client: what it
 * measures costs tens of microseconds, so the client must cost less and,
 * above all, the same for every target. It is one thread around one epoll
 * instance with plain non-blocking keep-alive HTTP/1.1 sockets
 * (TCP_NODELAY), each request pre-built once as bytes and sent with one
 * write(); responses are read with one read() per readiness event into a
 * minimal response reader (status line, Content-Length, chunked transfer
 * coding, close-delimited bodies) and a minimal SSE scanner that only
 * looks for `data:` lines, their `"content"` string and `[DONE]`. No
 * library does exactly this without costs of its own (libcurl's multi
 * interface adds a few microseconds and its own timers per transfer);
 * everything here is the least needed to time responses and check them.
 * The reader is resp.c, pure (bytes in, state out) and covered by
 * --self-test (resp_test.c), which bench/serve.sh runs before measuring.
 *
 * Every response is checked (status 200, the expected text, `[DONE]` at
 * the end of a stream); a failure is counted and reported, never timed,
 * and loadgen exits with status 1 when any request failed.
 *
 * Modes:
 *   count mode (--requests N): per target, --warmup requests first, then N
 *     measured requests split into --rounds blocks that alternate between
 *     the targets (A B C A B C ...), so drift in the machine's load falls
 *     on every target alike;
 *   time mode (--duration S): per target in turn, all connections busy for
 *     --warmup-seconds, then S measured seconds; throughput is responses
 *     completed inside the measured window divided by its length.
 *   once mode (--once): per target in turn, every connection sends exactly
 *     one measured request, no warm-up, no priming: --concurrency streams
 *     open at the same time (10,000 slow streams), the connections opened
 *     --open-per-ms at a time, the block cut after --block-seconds (what is
 *     still running then is reported as unfinished, not as failed). There
 *     is no per-iteration scan of the connections in this mode, so its cost
 *     follows the events, not the number of open streams.
 * In the other modes each block opens fresh connections and sends one
 * unmeasured priming request on each (so accept() and any per-connection
 * set-up on the server are not inside a measured request), and closes them
 * at its end. --gaps also records, for every content chunk of a stream
 * after the first, the time since the previous one (the gap a client sees
 * between tokens).
 * A target given --pid has its server paused (SIGSTOP) during the other
 * targets' blocks, so only the path being measured uses the CPU.
 */
#include "resp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Limits on what we are asked to do. */
#define EXPECT_MAX CONTENT_MAX
#define MAX_TARGETS 8
#define MAX_HEADERS 16
#define MAX_CONCURRENCY 65536
#define MAX_REQUESTS 10000000L
#define MAX_SAMPLES 50000000L          /* time mode, per target */
#define REQ_MAX 8192                   /* one request's bytes */
#define READ_CHUNK (64 * 1024)

/* ---------------------------------------------------------------------- */
/* Targets, connections, the event loop.                                    */

typedef struct {
    int64_t *v;
    size_t n, cap;
} samples;

typedef struct target target;

typedef struct {
    int fd;
    int state;          /* C_CLOSED, C_CONNECTING, C_IDLE, C_BUSY */
    int primed;         /* this block's priming request is done */
    int measured;       /* the request in flight counts */
    int want_out;       /* EPOLLOUT is registered */
    int live;           /* open and counted in `live` */
    int chunks_seen;    /* content chunks of this response so far */
    size_t sent;
    int64_t t_start, t_head, t_first, t_chunk;
    target *t;
    resp r;
} conn;

enum { C_CLOSED, C_CONNECTING, C_IDLE, C_BUSY };

struct target {
    const char *name;
    const char *url;
    const char *model;
    const char *headers[MAX_HEADERS];
    int nheaders;
    pid_t pid;          /* the server process behind it (--pid), or 0 */
    struct sockaddr_in addr;
    char host[64];
    const char *path;
    char req[REQ_MAX];
    size_t req_len;
    samples lat, ttft, ttfb, gap;
    long chunks_sum;
    long chunks_total;  /* content chunks received, every response */
    long unfinished;    /* once mode: still running when the block was cut */
    long max_inflight;  /* most requests in flight at once */
    long done;          /* measured responses */
    long answered;      /* every good response: warm-up, priming too */
    long errors;
    long reconnects;
    int64_t busy_ns;    /* sum of measured block durations (count mode) */
    int64_t window_ns;  /* time mode: measured window */
    char first_error[ERR_MAX + 64];
};

typedef struct {
    long concurrency;
    long requests;
    long warmup;
    long rounds;
    double duration;
    double warmup_seconds;
    int stream;
    const char *expect;
    size_t expect_len;
    const char *prompt;
    double max_seconds;
    int json;
    int self_test;
    int once;             /* --once */
    int gaps;             /* --gaps */
    long open_per_ms;     /* once mode: connections opened per 1 ms step */
    double block_seconds; /* once mode: a block's limit */
    const char *raw;    /* --raw PREFIX: PREFIX.NAME.txt per target */
    target targets[MAX_TARGETS];
    int ntargets;
} opts;

static opts O;
static int ep = -1;
static conn *conns;
static int64_t deadline_ns;
static long live;     /* connections open now */
static long inflight; /* requests sent and not yet ended */

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * --pid: a target's server process is paused (SIGSTOP) while any other
 * target is measured and continued (SIGCONT) for its own blocks, so a
 * server's background work (timers, a busy thread) cannot take CPU from
 * another's measurement on a small machine. Every paused process is
 * continued again on any exit. --pgid does the same for a server of
 * several processes (nginx's master and workers), kept as a negative
 * pid, which kill() takes as the process group.
 */
static void pause_others(const target *running)
{
    for (int i = 0; i < O.ntargets; i++) {
        const target *t = &O.targets[i];

        if (t->pid != 0 && kill(t->pid, t == running ? SIGCONT : SIGSTOP) < 0)
            fprintf(stderr, "loadgen: signal to %s (pid %ld): %s\n",
                    t->name, (long)t->pid, strerror(errno));
    }
}

static void continue_all(void)
{
    for (int i = 0; i < O.ntargets; i++)
        if (O.targets[i].pid != 0)
            kill(O.targets[i].pid, SIGCONT);
}

static void on_signal(int sig)
{
    continue_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void die(const char *fmt, ...)
{
    va_list ap;

    fputs("loadgen: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void samples_add(samples *s, int64_t v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        int64_t *nv;

        if (cap > (size_t)MAX_SAMPLES)
            die("more than %ld samples for one target", MAX_SAMPLES);
        if (!(nv = realloc(s->v, cap * sizeof(*nv))))
            die("out of memory");
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

static void target_error(target *t, const char *msg)
{
    t->errors++;
    if (!t->first_error[0])
        snprintf(t->first_error, sizeof(t->first_error), "%s", msg);
}

static void ep_set(conn *c, int out)
{
    struct epoll_event ev;

    ev.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0);
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        die("epoll_ctl: %s", strerror(errno));
    c->want_out = out;
}

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->state == C_BUSY)
        inflight--;
    if (c->live)
        live--;
    c->live = 0;
    c->fd = -1;
    c->state = C_CLOSED;
    c->want_out = 0;
}

static void conn_open(conn *c)
{
    struct epoll_event ev;
    int one = 1;

    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    c->live = 1;
    live++;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0)
        die("epoll_ctl: %s", strerror(errno));
    c->want_out = 1;
    if (connect(c->fd, (struct sockaddr *)&c->t->addr,
                sizeof(c->t->addr)) == 0) {
        c->state = C_IDLE;
        ep_set(c, 0);
    } else if (errno == EINPROGRESS) {
        c->state = C_CONNECTING;
    } else if (O.once) { /* one of many: counted, not fatal */
        char msg[ERR_MAX + 32];

        snprintf(msg, sizeof(msg), "connect: %s", strerror(errno));
        target_error(c->t, msg);
        conn_close(c);
    } else {
        die("connect %s: %s", c->t->url, strerror(errno));
    }
}

/* Sends what is left of the request; EPOLLOUT when the socket is full. */
static int conn_send(conn *c)
{
    while (c->sent < c->t->req_len) {
        ssize_t w = write(c->fd, c->t->req + c->sent,
                          c->t->req_len - c->sent);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            if (!c->want_out)
                ep_set(c, 1);
            return 0;
        }
        if (w <= 0)
            return -1;
        c->sent += (size_t)w;
    }
    if (c->want_out)
        ep_set(c, 0);
    return 0;
}

static void conn_issue(conn *c, int measured)
{
    c->measured = measured;
    c->state = C_BUSY;
    if (++inflight > c->t->max_inflight)
        c->t->max_inflight = inflight;
    c->sent = 0;
    c->chunks_seen = 0;
    c->t_head = c->t_first = c->t_chunk = 0;
    resp_init(&c->r, O.stream, BODY_MAX);
    c->t_start = now_ns();
    if (conn_send(c) < 0) {
        char msg[ERR_MAX + 32];

        snprintf(msg, sizeof(msg), "write: %s", strerror(errno));
        target_error(c->t, msg);
        c->t->reconnects++;
        conn_close(c);
    }
}

/* One block: a target's connections, what they do, when it ends. */
typedef struct {
    target *t;
    long to_issue;          /* count mode: measured requests not yet sent */
    int timed;              /* time mode */
    int64_t win_start, win_end;
    int stop;               /* time mode: the window is over */
} block;

/* A response ended (well or not): account for it. */
static void conn_done(block *b, conn *c, int ok, int64_t t_end)
{
    target *t = c->t;
    int counts = c->measured;

    if (b->timed)
        counts = c->measured && t_end >= b->win_start && t_end <= b->win_end;
    if (!ok) {
        target_error(t, c->r.err);
    } else {
        t->answered++;
        if (counts) {
            t->done++;
            samples_add(&t->lat, t_end - c->t_start);
            samples_add(&t->ttfb, c->t_head - c->t_start);
            if (c->r.stream) {
                samples_add(&t->ttft, c->t_first - c->t_start);
                t->chunks_sum += c->r.content_chunks;
            }
        }
    }
    if (!c->primed)
        c->primed = 1;
    inflight--;
    c->state = C_IDLE;
    if (!ok || c->r.close_after || O.once) {
        if (!ok)
            t->reconnects++;
        conn_close(c);
    }
}

/* Gives an idle (or closed) connection its next request, if any. */
static void conn_next(block *b, conn *c)
{
    int more = b->timed ? !b->stop : b->to_issue > 0;

    if (c->state == C_CLOSED && O.once)
        return; /* its one request is over */
    if (c->state == C_CLOSED) {
        /* Reopened after the server closed it, or after an error. */
        if (more || (!c->primed && !(b->timed && b->stop)))
            conn_open(c);
        return;
    }
    if (c->state != C_IDLE)
        return;
    if (!c->primed) {
        conn_issue(c, 0);
    } else if (more) {
        if (!b->timed)
            b->to_issue--;
        conn_issue(c, 1);
    }
}

/* New content chunks arrived: count them; with --gaps, the time since
 * the previous one (chunks that came in the same read: a gap of 0). */
static void saw_chunks(conn *c)
{
    int64_t t = now_ns();
    int k = c->r.content_chunks - c->chunks_seen;

    c->t->chunks_total += k;
    if (O.gaps && c->measured) {
        if (c->t_chunk)
            samples_add(&c->t->gap, t - c->t_chunk);
        while (--k > 0)
            samples_add(&c->t->gap, 0);
    }
    c->chunks_seen = c->r.content_chunks;
    c->t_chunk = t;
}

static void conn_readable(block *b, conn *c)
{
    static char buf[READ_CHUNK];
    ssize_t n;
    int rc;

    if (c->state == C_IDLE || c->state == C_CONNECTING) {
        /* Nothing asked: the server closed an idle connection. */
        n = read(c->fd, buf, sizeof(buf));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            conn_close(c);
        } else if (n > 0) {
            target_error(c->t, "bytes from the server before a request");
            conn_close(c);
        }
        return;
    }
    for (;;) {
        n = read(c->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) {
            resp_fail(&c->r, "read: %s", strerror(errno));
            conn_done(b, c, 0, now_ns());
            return;
        }
        if (n == 0) {
            rc = resp_eof(&c->r);
            if (rc == 1 && resp_check(&c->r, O.expect, O.expect_len) == 0) {
                c->r.close_after = 1;
                conn_done(b, c, 1, now_ns());
            } else {
                conn_done(b, c, 0, now_ns());
            }
            return;
        }
        rc = resp_feed(&c->r, buf, (size_t)n);
        if (c->r.saw_head && !c->t_head)
            c->t_head = now_ns();
        if (c->r.new_first)
            c->t_first = now_ns();
        if (c->r.content_chunks > c->chunks_seen)
            saw_chunks(c);
        if (rc == 1) {
            int64_t t_end = now_ns();
            int ok = resp_check(&c->r, O.expect, O.expect_len) == 0;

            conn_done(b, c, ok, t_end);
            return;
        }
        if (rc < 0) {
            conn_done(b, c, 0, now_ns());
            return;
        }
        if ((size_t)n < sizeof(buf))
            return;
    }
}

static void conn_writable(block *b, conn *c)
{
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);

        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err)
            die("connect %s: %s", c->t->url, strerror(err));
        c->state = C_IDLE;
        ep_set(c, 0);
        conn_next(b, c);
        return;
    }
    if (c->state == C_BUSY && conn_send(c) < 0) {
        resp_fail(&c->r, "write: %s", strerror(errno));
        conn_done(b, c, 0, now_ns());
    }
}

/* Handles what epoll_wait returned. */
static void on_events(block *b, struct epoll_event *evs, int n)
{
    for (int i = 0; i < n; i++) {
        conn *c = evs[i].data.ptr;

        if (c->fd < 0)
            continue;
        if (evs[i].events & (EPOLLOUT | EPOLLERR))
            conn_writable(b, c);
        if (c->fd >= 0 && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)))
            conn_readable(b, c);
        if (c->fd >= 0 && c->state == C_IDLE)
            conn_next(b, c);
    }
}

/*
 * --once: every connection of target t sends one measured request; they
 * are opened --open-per-ms at a time, one step a millisecond, and the
 * block ends when all are over or after --block-seconds, when the ones
 * still running are closed and counted as unfinished.
 */
static void run_once(target *t)
{
    struct epoll_event evs[256];
    block b;
    long nc = O.concurrency, next = 0;
    int64_t begin = now_ns(), cut;

    pause_others(t);
    memset(&b, 0, sizeof(b));
    b.t = t;
    b.to_issue = nc;
    cut = begin + (int64_t)(O.block_seconds * 1e9);
    for (;;) {
        int64_t now = now_ns();
        int n;

        if (now > deadline_ns)
            die("gave up after --max-seconds %.0f (target %s)", O.max_seconds,
                t->name);
        if (O.block_seconds > 0 && now >= cut) {
            t->unfinished += nc - next;
            for (long i = 0; i < next; i++)
                if (conns[i].fd >= 0) {
                    t->unfinished++;
                    conn_close(&conns[i]);
                }
            break;
        }
        for (long k = 0; next < nc && (O.open_per_ms == 0 || k < O.open_per_ms);
             k++) {
            conn *c = &conns[next++];

            c->t = t;
            c->primed = 1;
            conn_open(c);
            if (c->state == C_IDLE)
                conn_next(&b, c);
        }
        if (next == nc && live == 0)
            break;
        n = epoll_wait(ep, evs, 256, next < nc ? 1 : 100);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        on_events(&b, evs, n);
    }
    t->busy_ns += now_ns() - begin;
}

/*
 * Runs one block on target t: `count` measured requests (count mode) or,
 * with timed set, busy connections until the measured window ends.
 */
static void run_block(target *t, long count, int timed)
{
    struct epoll_event evs[256];
    block b;
    long nc = O.concurrency;
    int64_t begin;

    pause_others(t);
    memset(&b, 0, sizeof(b));
    b.t = t;
    b.to_issue = count;
    b.timed = timed;
    for (long i = 0; i < nc; i++) {
        conns[i].t = t;
        conns[i].primed = 0;
        conn_open(&conns[i]);
    }
    /* Connections become idle as they connect, and get requests then. */
    begin = now_ns();
    if (timed) {
        b.win_start = begin + (int64_t)(O.warmup_seconds * 1e9);
        b.win_end = b.win_start + (int64_t)(O.duration * 1e9);
    }
    for (;;) {
        int64_t now = now_ns();
        int n, idle_all = 1;

        if (now > deadline_ns)
            die("gave up after --max-seconds %.0f (target %s)",
                O.max_seconds, t->name);
        if (timed && now >= b.win_end)
            b.stop = 1;
        for (long i = 0; i < nc; i++) {
            if (conns[i].state == C_IDLE || conns[i].state == C_CLOSED)
                conn_next(&b, &conns[i]);
            if (conns[i].state == C_BUSY || conns[i].state == C_CONNECTING)
                idle_all = 0;
        }
        if (idle_all && (timed ? b.stop : b.to_issue == 0))
            break;
        n = epoll_wait(ep, evs, 256, timed ? 10 : 100);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        on_events(&b, evs, n);
    }
    if (timed)
        t->window_ns += b.win_end - b.win_start;
    else
        t->busy_ns += now_ns() - begin;
    for (long i = 0; i < nc; i++)
        conn_close(&conns[i]);
}

/* ---------------------------------------------------------------------- */
/* Set-up and reporting.                                                    */

static void parse_url(target *t)
{
    const char *u = t->url, *hp, *slash, *colon;
    char ip[32];
    long port;
    size_t n;

    if (strncmp(u, "http://", 7) != 0)
        die("%s: only http:// URLs", u);
    hp = u + 7;
    slash = strchr(hp, '/');
    if (!slash)
        die("%s: no path", u);
    n = (size_t)(slash - hp);
    if (n >= sizeof(t->host))
        die("%s: host too long", u);
    memcpy(t->host, hp, n);
    t->host[n] = '\0';
    colon = strrchr(t->host, ':');
    if (!colon || (size_t)(colon - t->host) >= sizeof(ip))
        die("%s: the URL needs IPV4:PORT", u);
    memcpy(ip, t->host, (size_t)(colon - t->host));
    ip[colon - t->host] = '\0';
    port = strtol(colon + 1, NULL, 10);
    if (port < 1 || port > 65535)
        die("%s: bad port", u);
    memset(&t->addr, 0, sizeof(t->addr));
    t->addr.sin_family = AF_INET;
    t->addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &t->addr.sin_addr) != 1)
        die("%s: the host must be a numeric IPv4 address", u);
    t->path = slash;
}

/* A string fit for a JSON literal without escaping. */
static void check_plain(const char *what, const char *s)
{
    for (const char *p = s; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            die("%s must not contain quotes, backslashes or control "
                "characters", what);
}

static void build_request(target *t)
{
    char body[1024];
    int bl, n;
    size_t len;

    /* A streamed request asks for the usage chunk: loom asks its upstream
     * for it (it counts cost from it), and the fake, like every target,
     * must be sent the same request, or the fake direct streams one
     * chunk (and with chunk delays one delay) fewer than the targets in
     * front of it relay. */
    bl =
        snprintf(body, sizeof(body),
                 "{\"model\":\"%s\",\"stream\":%s,%s\"messages\":"
                 "[{\"role\":\"user\",\"content\":\"%s\"}]}",
                 t->model, O.stream ? "true" : "false",
                 O.stream ? "\"stream_options\":{\"include_usage\":true}," : "",
                 O.prompt);
    if (bl < 0 || (size_t)bl >= sizeof(body))
        die("request body too long");
    n = snprintf(t->req, sizeof(t->req),
                 "POST %s HTTP/1.1\r\nHost: %s\r\n"
                 "Content-Type: application/json\r\n"
                 "Accept: %s\r\nContent-Length: %d\r\n",
                 t->path, t->host,
                 O.stream ? "text/event-stream" : "application/json", bl);
    if (n < 0 || (size_t)n >= sizeof(t->req))
        die("request too long");
    len = (size_t)n;
    for (int i = 0; i < t->nheaders; i++) {
        n = snprintf(t->req + len, sizeof(t->req) - len, "%s\r\n",
                     t->headers[i]);
        if (n < 0 || (size_t)n >= sizeof(t->req) - len)
            die("request too long");
        len += (size_t)n;
    }
    n = snprintf(t->req + len, sizeof(t->req) - len, "\r\n%s", body);
    if (n < 0 || (size_t)n >= sizeof(t->req) - len)
        die("request too long");
    t->req_len = len + (size_t)n;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile (p in 0..100) in µs; the array is sorted. */
static double pct(const samples *s, double p)
{
    size_t k;

    if (s->n == 0)
        return -1;
    k = (size_t)((p / 100.0) * (double)s->n + 0.999999);
    if (k < 1)
        k = 1;
    if (k > s->n)
        k = s->n;
    return (double)s->v[k - 1] / 1000.0;
}

static double mean_us(const samples *s)
{
    double sum = 0;

    if (s->n == 0)
        return -1;
    for (size_t i = 0; i < s->n; i++)
        sum += (double)s->v[i];
    return sum / (double)s->n / 1000.0;
}

static void json_num(const char *key, double v)
{
    if (v < 0)
        printf(",\"%s\":null", key);
    else
        printf(",\"%s\":%.1f", key, v);
}

/* ,"key":"s" (JSON-escaped; null for NULL); only the value without key. */
static void json_str(const char *key, const char *s)
{
    if (key)
        printf(",\"%s\":", key);
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static double rps_of(const target *t)
{
    int64_t ns = O.duration > 0 ? t->window_ns : t->busy_ns;

    return ns > 0 ? (double)t->done * 1e9 / (double)ns : -1;
}

/*
 * --raw: every measured request of each target as one line, in the order
 * they completed: latency, time to first byte and (streams) time to first
 * token, in µs. For looking at what percentiles hide (periodic stalls).
 */
static void write_raw(void)
{
    for (int i = 0; i < O.ntargets && O.raw; i++) {
        const target *t = &O.targets[i];
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s.%s.txt", O.raw, t->name);
        if (!(f = fopen(path, "w")))
            die("%s: %s", path, strerror(errno));
        for (size_t k = 0; k < t->lat.n; k++) {
            fprintf(f, "%.1f %.1f", (double)t->lat.v[k] / 1000.0,
                    (double)t->ttfb.v[k] / 1000.0);
            if (k < t->ttft.n)
                fprintf(f, " %.1f", (double)t->ttft.v[k] / 1000.0);
            fputc('\n', f);
        }
        if (fclose(f) != 0)
            die("%s: %s", path, strerror(errno));
    }
}

static void report(void)
{
    const target *base = &O.targets[0];

    for (int i = 0; i < O.ntargets; i++) {
        target *t = &O.targets[i];

        samples *all[] = {&t->lat, &t->ttft, &t->ttfb, &t->gap};

        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
            if (all[k]->n)
                qsort(all[k]->v, all[k]->n, sizeof(int64_t), cmp64);
    }
    if (!O.json)
        fprintf(stdout, "%-10s %8s %6s %9s %9s %9s %9s %9s %9s %9s\n",
                "target", "done", "errors", "req/s", "p50 µs", "p99 µs",
                "+p50 µs", "+p99 µs", "ttft p50", "+ttft p50");
    for (int i = 0; i < O.ntargets; i++) {
        const target *t = &O.targets[i];
        double ap50 = -1, ap99 = -1, tp50 = -1, tp99 = -1, ratio = -1;
        double gp99 = -1;
        int has_base = i > 0 && base->lat.n && t->lat.n;

        if (has_base) {
            ap50 = pct(&t->lat, 50) - pct(&base->lat, 50);
            ap99 = pct(&t->lat, 99) - pct(&base->lat, 99);
            if (O.stream && base->ttft.n && t->ttft.n) {
                tp50 = pct(&t->ttft, 50) - pct(&base->ttft, 50);
                tp99 = pct(&t->ttft, 99) - pct(&base->ttft, 99);
            }
            if (rps_of(base) > 0 && rps_of(t) >= 0)
                ratio = rps_of(t) / rps_of(base);
            if (base->gap.n && t->gap.n)
                gp99 = pct(&t->gap, 99) - pct(&base->gap, 99);
        }
        if (!O.json) {
            printf("%-10s %8ld %6ld %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f "
                   "%9.1f\n", t->name, t->done, t->errors, rps_of(t),
                   pct(&t->lat, 50), pct(&t->lat, 99), ap50, ap99,
                   pct(&t->ttft, 50), tp50);
            if (t->first_error[0])
                printf("  first error: %s\n", t->first_error);
            continue;
        }
        printf("{\"target\":");
        json_str(NULL, t->name);
        printf(",\"stream\":%s,\"concurrency\":%ld,\"mode\":\"%s\"",
               O.stream ? "true" : "false", O.concurrency,
               O.once           ? "once"
               : O.duration > 0 ? "time"
                                : "count");
        printf(",\"done\":%ld,\"answered\":%ld,\"errors\":%ld,"
               "\"reconnects\":%ld,\"unfinished\":%ld,\"max_inflight\":%ld,"
               "\"chunks_total\":%ld",
               t->done, t->answered, t->errors, t->reconnects, t->unfinished,
               t->max_inflight, t->chunks_total);
        json_num("seconds",
                 (double)(O.duration > 0 ? t->window_ns : t->busy_ns) / 1e9);
        json_num("rps", rps_of(t));
        json_num("lat_mean_us", mean_us(&t->lat));
        json_num("lat_p50_us", pct(&t->lat, 50));
        json_num("lat_p90_us", pct(&t->lat, 90));
        json_num("lat_p95_us", pct(&t->lat, 95));
        json_num("lat_p99_us", pct(&t->lat, 99));
        json_num("lat_p999_us", pct(&t->lat, 99.9));
        json_num("lat_max_us", pct(&t->lat, 100));
        json_num("ttfb_p50_us", pct(&t->ttfb, 50));
        json_num("ttfb_p99_us", pct(&t->ttfb, 99));
        json_num("ttft_p50_us", pct(&t->ttft, 50));
        json_num("ttft_p99_us", pct(&t->ttft, 99));
        json_num("ttft_max_us", pct(&t->ttft, 100));
        json_num("chunks_mean", t->ttft.n ? (double)t->chunks_sum /
                                            (double)t->ttft.n : -1);
        json_num("gap_p50_us", pct(&t->gap, 50));
        json_num("gap_p99_us", pct(&t->gap, 99));
        json_num("gap_p999_us", pct(&t->gap, 99.9));
        json_num("gap_max_us", pct(&t->gap, 100));
        if (i > 0) {
            printf(",\"baseline\":");
            json_str(NULL, base->name);
            /* Added figures may be negative: print them as they are. */
            if (has_base) {
                printf(",\"added_lat_p50_us\":%.1f,\"added_lat_p99_us\":%.1f",
                       ap50, ap99);
                if (tp50 != -1 || tp99 != -1)
                    printf(",\"added_ttft_p50_us\":%.1f,"
                           "\"added_ttft_p99_us\":%.1f", tp50, tp99);
                if (ratio >= 0)
                    printf(",\"rps_vs_baseline\":%.3f", ratio);
                if (gp99 != -1)
                    printf(",\"added_gap_p99_us\":%.1f", gp99);
            }
        }
        json_str("first_error", t->first_error[0] ? t->first_error : NULL);
        printf("}\n");
    }
    fflush(stdout);
}

static const char usage[] =
    "usage: loadgen [options] --target NAME URL [--model M] "
    "[--header 'N: v']... [--pid PID | --pgid PGID] ...\n"
    "       loadgen --self-test\n"
    "\n"
    "  --concurrency N      connections per target (default 1)\n"
    "  --requests N         count mode: measured requests per target\n"
    "  --warmup N           count mode: warm-up requests per target\n"
    "  --rounds R           count mode: blocks per target, interleaved\n"
    "  --duration S         time mode: measured seconds per target\n"
    "  --once               once mode: one request per connection\n"
    "  --open-per-ms N      once mode: connections opened per ms (0: all)\n"
    "  --block-seconds S    once mode: cut each target's block after S s\n"
    "  --gaps               record the gaps between content chunks\n"
    "  --warmup-seconds S   time mode: busy seconds before measuring\n"
    "  --stream             ask for streamed answers\n"
    "  --expect TEXT        the answer's text (JSON-escaped form)\n"
    "  --prompt TEXT        the user message (default 'Say hi.')\n"
    "  --max-seconds S      give up after S seconds (default 900)\n"
    "  --json               one JSON line per target on stdout\n"
    "  --raw PREFIX         every measured request to PREFIX.NAME.txt\n"
    "\n"
    "The first target is the baseline of the others' added figures.\n"
    "--pid: the target's server, paused while other targets run;\n"
    "--pgid: the same for a server's process group.\n"
    "Exit status: 0, 1 when a request failed, 2 usage or set-up error.\n";

/* The soft limit on open files raised to the hard one (10,000 streams
 * need as many sockets); too few for --concurrency is an error. */
static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        die("getrlimit: %s", strerror(errno));
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t)O.concurrency + 16)
        die("--concurrency %ld needs %ld open files; the limit is %ld",
            O.concurrency, O.concurrency + 16, (long)rl.rlim_cur);
}

static long num(const char *opt, const char *v, long lo, long hi)
{
    char *end;
    long n;

    errno = 0;
    n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || n < lo || n > hi)
        die("%s needs an integer from %ld to %ld\n\n%s", opt, lo, hi, usage);
    return n;
}

static double fnum(const char *opt, const char *v, double lo, double hi)
{
    char *end;
    double d;

    d = v ? strtod(v, &end) : 0;
    if (!v || *end || !(d >= lo && d <= hi))
        die("%s needs a number from %g to %g\n\n%s", opt, lo, hi, usage);
    return d;
}

static void parse_args(int argc, char **argv)
{
    target *cur = NULL;

    O.concurrency = 1;
    O.rounds = 1;
    O.max_seconds = 900;
    O.prompt = "Say hi.";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--self-test")) {
            O.self_test = 1;
        } else if (!strcmp(a, "--json")) {
            O.json = 1;
        } else if (!strcmp(a, "--raw") && v) {
            O.raw = v, i++;
        } else if (!strcmp(a, "--stream")) {
            O.stream = 1;
        } else if (!strcmp(a, "--once")) {
            O.once = 1;
        } else if (!strcmp(a, "--gaps")) {
            O.gaps = 1;
        } else if (!strcmp(a, "--open-per-ms")) {
            O.open_per_ms = num(a, v, 0, MAX_CONCURRENCY), i++;
        } else if (!strcmp(a, "--block-seconds")) {
            O.block_seconds = fnum(a, v, 0, 86400), i++;
        } else if (!strcmp(a, "--concurrency")) {
            O.concurrency = num(a, v, 1, MAX_CONCURRENCY), i++;
        } else if (!strcmp(a, "--requests")) {
            O.requests = num(a, v, 1, MAX_REQUESTS), i++;
        } else if (!strcmp(a, "--warmup")) {
            O.warmup = num(a, v, 0, MAX_REQUESTS), i++;
        } else if (!strcmp(a, "--rounds")) {
            O.rounds = num(a, v, 1, 1000), i++;
        } else if (!strcmp(a, "--duration")) {
            O.duration = fnum(a, v, 0.1, 3600), i++;
        } else if (!strcmp(a, "--warmup-seconds")) {
            O.warmup_seconds = fnum(a, v, 0, 3600), i++;
        } else if (!strcmp(a, "--max-seconds")) {
            O.max_seconds = fnum(a, v, 1, 86400), i++;
        } else if (!strcmp(a, "--expect") && v) {
            O.expect = v, i++;
            O.expect_len = strlen(v);
            if (O.expect_len > EXPECT_MAX)
                die("--expect: over %d bytes", EXPECT_MAX);
        } else if (!strcmp(a, "--prompt") && v) {
            O.prompt = v, i++;
            check_plain("--prompt", v);
        } else if (!strcmp(a, "--target") && v && i + 2 < argc) {
            if (O.ntargets == MAX_TARGETS)
                die("at most %d targets", MAX_TARGETS);
            cur = &O.targets[O.ntargets++];
            cur->name = argv[++i];
            cur->url = argv[++i];
            cur->model = "fake-model";
            check_plain("a target name", cur->name);
        } else if (!strcmp(a, "--pid") && v && cur) {
            cur->pid = (pid_t)num(a, v, 1, INT_MAX), i++;
        } else if (!strcmp(a, "--pgid") && v && cur) {
            /* Never 1: kill(-1) would signal every process. */
            cur->pid = -(pid_t)num(a, v, 2, INT_MAX), i++;
        } else if (!strcmp(a, "--model") && v && cur) {
            cur->model = v, i++;
            check_plain("--model", v);
        } else if (!strcmp(a, "--header") && v && cur) {
            if (cur->nheaders == MAX_HEADERS)
                die("at most %d headers per target", MAX_HEADERS);
            if (!strchr(v, ':') || strpbrk(v, "\r\n"))
                die("--header needs 'Name: value' on one line");
            cur->headers[cur->nheaders++] = v, i++;
        } else {
            die("bad argument '%s'\n\n%s", a, usage);
        }
    }
    if (O.self_test)
        return;
    if (O.ntargets == 0)
        die("no --target\n\n%s", usage);
    if (O.once && (O.requests > 0 || O.duration > 0))
        die("--once takes neither --requests nor --duration\n\n%s", usage);
    if (!O.once && (O.requests > 0) == (O.duration > 0))
        die("give either --requests or --duration\n\n%s", usage);
    if (O.requests && O.requests < O.rounds)
        die("--requests must be at least --rounds");
}

int main(int argc, char **argv)
{
    int64_t start;
    int failed = 0;

    parse_args(argc, argv);
    if (O.self_test)
        return resp_self_test();
    signal(SIGPIPE, SIG_IGN);
    atexit(continue_all);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    raise_nofile();
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1: %s", strerror(errno));
    if (!(conns = calloc((size_t)O.concurrency, sizeof(*conns))))
        die("out of memory");
    for (long i = 0; i < O.concurrency; i++)
        conns[i].fd = -1;
    for (int i = 0; i < O.ntargets; i++) {
        parse_url(&O.targets[i]);
        build_request(&O.targets[i]);
    }
    start = now_ns();
    deadline_ns = start + (int64_t)(O.max_seconds * 1e9);

    if (O.once) {
        for (int i = 0; i < O.ntargets; i++)
            run_once(&O.targets[i]);
    } else if (O.duration > 0) {
        for (int i = 0; i < O.ntargets; i++)
            run_block(&O.targets[i], 0, 1);
    } else {
        /* Warm-up: its failures count, its timings are dropped. */
        for (int i = 0; i < O.ntargets && O.warmup > 0; i++) {
            target *t = &O.targets[i];

            run_block(t, O.warmup, 0);
            t->lat.n = t->ttft.n = t->ttfb.n = 0;
            t->done = 0;
            t->chunks_sum = 0;
            t->busy_ns = 0;
        }
        for (long r = 0; r < O.rounds; r++)
            for (int i = 0; i < O.ntargets; i++) {
                long per = O.requests / O.rounds +
                           (r < O.requests % O.rounds ? 1 : 0);

                run_block(&O.targets[i], per, 0);
            }
    }
    continue_all();
    write_raw();
    report();
    for (int i = 0; i < O.ntargets; i++) {
        if (O.targets[i].errors) {
            fprintf(stderr, "loadgen: %s: %ld failed requests; first: %s\n",
                    O.targets[i].name, O.targets[i].errors,
                    O.targets[i].first_error);
            failed = 1;
        }
        free(O.targets[i].lat.v);
        free(O.targets[i].ttft.v);
        free(O.targets[i].ttfb.v);
        free(O.targets[i].gap.v);
    }
    for (long i = 0; i < O.concurrency; i++)
        resp_free(&conns[i].r);
    free(conns);
    close(ep);
    return failed;
}
