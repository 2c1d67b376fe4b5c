/*
 * Internal to loom-fake-upstream: the script model and the renderers that
 * turn a script entry into response bytes, shared by fake_script.c (which
 * does no network I/O) and fake_upstream.c (the HTTP server and main).
 */
#ifndef LOOM_FAKE_UPSTREAM_H
#define LOOM_FAKE_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#define FAKE_MAX_FILE (256u * 1024 * 1024) /* script, replay, body files */
#define FAKE_CREATED 1700000000            /* default "created" */

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
} fake_resp;

typedef struct {
    json_t *root;
    fake_resp *resp;
    size_t n;
    bool loop;
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
    size_t disconnect_after; /* SIZE_MAX: never */
    size_t hang_after;       /* SIZE_MAX: never */
    int fd;                  /* the client's socket, to see it leave */
} fake_stream;

/* What a generated answer needs beyond its script entry. */
typedef struct {
    const fake_resp *r;
    char id[64];
    bool usage_chunk; /* the stream ends with a usage chunk */
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

/* Frees a stream and its chunks (MHD's free callback; NULL ok). */
void fake_stream_free(void *s);
/* Appends a chunk, taking ownership of data (freed on failure); -1 when
 * data is NULL or memory runs out. */
int fake_stream_take(fake_stream *s, char *data, size_t len);
/* Appends a body split into SSE events (each ends after a blank line). */
int fake_stream_split(fake_stream *s, const char *body, size_t len);

/* Appends the chat.completion.chunk events of a generated answer, ending
 * with `data: [DONE]` (or with the error event of "stream_error"). */
int fake_render_stream(fake_stream *s, const fake_gen *gn);
/* The chat.completion object of a generated answer; new reference. */
json_t *fake_render_message(const fake_gen *gn);
/* {"error":{"message","type","param":null,"code":null}}; new reference. */
json_t *fake_error_body(const char *msg, const char *type);

#endif
