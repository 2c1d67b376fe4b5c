/*
 * Internal to loom-fake-upstream: the script model and the renderers that
 * turn a script entry into response bytes, shared by fake_script.c (script
 * loading, shared helpers and the OpenAI Chat Completions shape),
 * fake_anthropic.c, fake_gemini.c and fake_responses.c (the other wire
 * formats; none of these does network I/O) and fake_upstream.c (the HTTP
 * server and main).
 */
#ifndef LOOM_FAKE_UPSTREAM_H
#define LOOM_FAKE_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>
#include <pthread.h>

#define FAKE_MAX_FILE (256u * 1024 * 1024) /* script, replay, body files */
#define FAKE_CREATED 1700000000            /* default "created" */

/* The wire format of a generated answer. */
typedef enum {
    FAKE_FMT_AUTO = 0,  /* not given: chosen by the request path */
    FAKE_FMT_CHAT,      /* OpenAI Chat Completions */
    FAKE_FMT_ANTHROPIC, /* Anthropic Messages */
    FAKE_FMT_GEMINI,    /* Google Gemini generateContent */
    FAKE_FMT_RESPONSES, /* OpenAI Responses */
} fake_format;

/* One tool call of a generated answer. */
typedef struct {
    const char *id; /* NULL: "call_fake_<k+1>" */
    const char *name;
    const char **frags; /* argument fragments, borrowed from the script */
    size_t nfrags;
} fake_call;

/* One entry of the script's "responses", checked once at load. Strings
 * and JSON values are borrowed from the script document. */
typedef struct {
    int status; /* 0: the default for the kind of answer */
    json_t *headers;
    long delay_ms;
    long chunk_delay_ms;
    long disconnect_after; /* -1: never */
    bool hang;
    long hang_after;
    json_t *error;
    bool has_body;
    char *body; /* owned; body or body_file */
    size_t body_len;
    const char *content_type;
    /* generated answer */
    json_t *reasoning;
    json_t *text;
    fake_call *calls; /* owned */
    size_t ncalls;
    bool interleave;
    json_t *usage;
    const char *finish_reason;
    const char *model;
    const char *id;
    json_int_t created;
    json_t *stream_error;
    /* other wire formats */
    fake_format format;            /* FAKE_FMT_AUTO: the script's, or path */
    bool reasoning_text;           /* responses: reasoning_kind "text" */
    bool failed_event;             /* responses: stream_error as failed */
    const char *signature;         /* anthropic thinking signature */
    const char *redacted_thinking; /* anthropic redacted_thinking data */
    const char *thought_signature; /* gemini thoughtSignature */
} fake_resp;

/* What a rule asks of a request; NULL fields ask nothing. Borrowed from
 * the script document. */
typedef struct {
    const char *first_user;   /* substring of the first user message */
    const char *any_message;  /* substring of some message */
    const char *last_message; /* substring of the last message */
    const char *system;       /* substring of the system prompt */
    json_t *tools;            /* exactly these tool names are offered */
    json_t *tools_include;    /* at least these tool names are offered */
} fake_match;

/* One entry of the script's "rules": its own answers and cursor. */
typedef struct {
    fake_match match;
    fake_resp *resp; /* owned */
    size_t n;
    bool loop;
    size_t next; /* answers given so far; under fake_script.lock */
} fake_rule;

typedef struct {
    json_t *root;
    fake_resp *resp;
    size_t n;
    bool loop;
    fake_format format; /* the script's default, FAKE_FMT_AUTO if none */
    fake_rule *rules;   /* owned */
    size_t nrules;
    size_t plain_next;    /* requests no rule matched; under lock */
    pthread_mutex_t lock; /* the cursors */
} fake_script;

/* A body prepared as a list of chunks, sent one by one. */
typedef struct {
    char **chunk;
    size_t *len;
    size_t n;
    size_t cap;
    size_t cur; /* chunk being sent */
    size_t off; /* bytes of it already sent */
    long chunk_delay_ms;
    uint64_t due;            /* CLOCK_MONOTONIC µs chunk due_for is due */
    size_t due_for;          /* SIZE_MAX: none yet */
    size_t disconnect_after; /* SIZE_MAX: never */
    size_t hang_after;       /* SIZE_MAX: never */
    int fd;                  /* the client's socket, to see it leave */
    void *owner;             /* fake_upstream.c's connection state */
} fake_stream;

struct MHD_Connection;

/* A pause of one connection in event mode (fake_wait.c). */
enum { FAKE_WAIT_IDLE = 0, FAKE_WAIT_PENDING, FAKE_WAIT_DONE };
typedef struct fake_wait {
    int state;    /* FAKE_WAIT_*; IDLE again once the outcome is read */
    bool gone;    /* DONE because the client left or the server stops */
    uint64_t due; /* CLOCK_MONOTONIC µs; UINT64_MAX: never */
    int fd;       /* the client's socket, or -1 */
    struct MHD_Connection *con;
    size_t heap_i;     /* SIZE_MAX when not pending */
    atomic_int *count; /* decremented (and cleared) when the wait ends */
} fake_wait;

/* Starts the waiter thread of event mode; exits with 2 on failure. */
void fake_waiter_start(void);

/* Resumes every pending wait as gone and ends the waiter thread; a wait
 * begun afterwards is resumed at once, as gone. Call before
 * MHD_stop_daemon. */
void fake_waiter_stop(void);

/* us microseconds as a timespec: waits to the microsecond (ppoll,
 * epoll_pwait2, nanosleep), since a fixed schedule's waits are not whole
 * milliseconds. */
static inline struct timespec fake_timespec_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000u),
                          (long)(us % 1000000u) * 1000L};
    return ts;
}

/* From an MHD callback of con: suspends con and resumes it at due
 * (CLOCK_MONOTONIC µs; UINT64_MAX: never), when the client on fd (>= 0)
 * closes its side (pauses over 250 ms), or when the server stops; w->state is
 * then FAKE_WAIT_DONE and w->gone says whether it ended early. The callback
 * returns at once and reads the outcome when MHD calls it again. */
void fake_wait_begin(fake_wait *w, struct MHD_Connection *con, int fd,
                     uint64_t due);

/* What a generated answer needs beyond its script entry. */
typedef struct {
    const fake_resp *r;
    const char *id;   /* the script's "id", or idbuf */
    char idbuf[64];   /* a generated id */
    bool usage_chunk; /* the stream ends with a usage chunk */
    fake_format fmt;  /* resolved: never FAKE_FMT_AUTO */
    uint64_t n;       /* request number, for generated ids */
    bool sse;         /* gemini streams: SSE (alt=sse), else a JSON array */
} fake_gen;

/* Prints "loom-fake-upstream: <message>" to stderr and exits with 2. */
void fake_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)))
__attribute__((noreturn));

/* Reads a regular file of at most FAKE_MAX_FILE bytes, NUL-terminated;
 * NULL with errno set on failure. The caller frees. */
char *fake_read_file(const char *path, size_t *len);

/* Strict decimal long in [lo, hi], trailing whitespace allowed. */
bool fake_parse_long(const char *s, long lo, long hi, long *out);

/* Loads and checks a script file into *sc; on any problem prints why and
 * exits with 2. body_file paths are relative to the script's folder. */
void fake_script_load(fake_script *sc, const char *path);
void fake_script_free(fake_script *sc);

/*
 * Chooses the answer to request n (1-based) whose parsed body is body
 * (NULL when it has none): the next answer of the first rule that matches
 * it, else of the plain "responses" (by n when the script has no rules,
 * else by the count of requests no rule matched). Thread-safe. NULL when
 * the chosen list is exhausted, with a message in why (of size n_why).
 */
const fake_resp *fake_script_pick(fake_script *sc, json_t *body, uint64_t n,
                                  char *why, size_t n_why);

/* Reads a rule's "match" object (rule k); exits with 2 when it is bad. */
void fake_match_load(fake_match *m, json_t *o, size_t k);
/* True when the request body (any wire format) satisfies m. */
bool fake_match_request(const fake_match *m, json_t *body);

/* Frees a stream and its chunks (MHD's free callback; NULL ok). */
void fake_stream_free(void *s);
/* Appends a chunk, taking ownership of data (freed on failure); -1 when
 * data is NULL or memory runs out. */
int fake_stream_take(fake_stream *s, char *data, size_t len);
/* Appends a body split into SSE events (each ends after a blank line). */
int fake_stream_split(fake_stream *s, const char *body, size_t len);

/* Appends a copy of len bytes as one chunk. */
int fake_stream_copy(fake_stream *s, const char *data, size_t len);
/*
 * Appends one SSE event, `[event: <event>\n]data: <compact obj><eol><eol>`
 * (event NULL: no event line; eol "\n" or "\r\n"), and releases obj;
 * -1 when obj is NULL or memory runs out.
 */
int fake_stream_event(fake_stream *s, const char *event, json_t *obj,
                      const char *eol);

/* The format named name ("openai-chat", "anthropic", "gemini",
 * "openai-responses"); FAKE_FMT_AUTO for any other name. */
fake_format fake_format_parse(const char *name);
/* The format a request path (without its query) asks for: .../v1/messages
 * anthropic, .../models/M:(stream)generateContent gemini, .../v1/responses
 * openai-responses, anything else openai-chat. */
fake_format fake_format_of_path(const char *path);

/* Joins a JSON array of strings (or, when arr is NULL, n C strings) into
 * a new JSON string; NULL when memory runs out. */
json_t *fake_join(json_t *arr, const char **strs, size_t n);
/* Call k's id: its own (borrowed from the script), else "<prefix><k+1>"
 * written into buf (n >= 64 is enough), which is returned. */
const char *fake_call_id(const fake_call *c, size_t k, const char *prefix,
                         char *buf, size_t n);
/* Call c's arguments joined and parsed: a new JSON object ({} when there
 * are none), or NULL when they are not a JSON object. */
json_t *fake_call_args(const fake_call *c);
/* True when every call's arguments parse as a JSON object (the formats
 * that carry arguments as objects need that). */
bool fake_args_ok(const fake_resp *r);
/* True when usage is written in OpenAI Chat names (it has "prompt_tokens"
 * or "completion_tokens") and must be translated for other formats. */
bool fake_usage_is_openai(json_t *usage);
/* usage.key, or usage.key.sub when sub is not NULL, when it is an
 * integer; else dflt. */
json_int_t fake_usage_int(json_t *usage, const char *key, const char *sub,
                          json_int_t dflt);

/* Appends the events of a generated answer in gn->fmt: for Chat the
 * chat.completion.chunk events ending with `data: [DONE]` (or with the
 * error event of "stream_error"); see docs/fake-upstream.md for all. */
int fake_render_stream(fake_stream *s, const fake_gen *gn);
/* The non-streamed answer object in gn->fmt; new reference. */
json_t *fake_render_message(const fake_gen *gn);
/* {"error":{"message","type","param":null,"code":null}}; new reference. */
json_t *fake_error_body(const char *msg, const char *type);
/* The HTTP error body of a script's "error" object (borrowed) in fmt's
 * shape, with the fields the format needs filled in from status; new
 * reference. */
json_t *fake_render_error(fake_format fmt, int status, json_t *error);

/* Per format (fake_anthropic.c, fake_gemini.c, fake_responses.c). */
int fake_anthropic_stream(fake_stream *s, const fake_gen *gn);
json_t *fake_anthropic_message(const fake_gen *gn);
json_t *fake_anthropic_error(int status, json_t *error);
int fake_gemini_stream(fake_stream *s, const fake_gen *gn);
json_t *fake_gemini_message(const fake_gen *gn);
json_t *fake_gemini_error(int status, json_t *error);
int fake_responses_stream(fake_stream *s, const fake_gen *gn);
json_t *fake_responses_message(const fake_gen *gn);

#endif
