/*
 * Internal: how the parts of a run send events.
 *
 * Events go out only from run.c, which numbers them and hands them to the
 * caller's sink. The tool turn (toolturn.c) and the plan (plan.c) do not
 * see the run: run.c gives them a loom__emit callback, NULL when the run
 * has no sink (then no payload is built at all).
 *
 * Payloads are built with the pk_ helpers below rather than json_pack:
 * the same objects (keys in the same order, and NULL for the whole
 * payload when a value is missing or not UTF-8, as json_pack fails),
 * without parsing a format string per event.
 */
#ifndef LOOM_AGENT_EMIT_H
#define LOOM_AGENT_EMIT_H

#include "loom/run.h"

#include <jansson.h>

/* Sends one event; takes data (NULL: an empty object). */
typedef void (*loom__emit_fn)(loom_event_type type, json_t *data,
                              void *payload);

typedef struct {
    loom__emit_fn fn; /* NULL: nobody listens */
    void *payload;
} loom__emit;

static inline int loom__emit_on(const loom__emit *e)
{
    return e->fn != NULL;
}

/* Sends data when someone listens; frees it otherwise. */
static inline void loom__emit_send(const loom__emit *e, loom_event_type type,
                                   json_t *data)
{
    if (e->fn)
        e->fn(type, data, e->payload);
    else
        json_decref(data);
}

typedef struct {
    json_t *o;
    int bad;
} pk;

static inline pk pk_new(void)
{
    pk p;

    p.o = json_object();
    p.bad = !p.o;
    return p;
}

/* o[key] = v, stealing v; key is a literal (ASCII), so not checked. */
static inline void pk_set(pk *p, const char *key, json_t *v)
{
    if (!v) {
        p->bad = 1;
        return;
    }
    if (p->bad || json_object_set_new_nocheck(p->o, key, v) != 0)
        p->bad = 1;
    if (p->bad)
        json_decref(v);
}

/* "s:s": a string, required. */
static inline void pk_str(pk *p, const char *key, const char *s)
{
    pk_set(p, key, s ? json_string(s) : NULL);
}

/* "s:s?": a string, or null. */
static inline void pk_str_or_null(pk *p, const char *key, const char *s)
{
    pk_set(p, key, s ? json_string(s) : json_null());
}

static inline void pk_int(pk *p, const char *key, json_int_t v)
{
    pk_set(p, key, json_integer(v));
}

/* A usage's five token counts, prompt_tokens to total_tokens. */
static inline void pk_usage_tokens(pk *p, const loom_usage *u)
{
    pk_int(p, "prompt_tokens", (json_int_t)u->prompt_tokens);
    pk_int(p, "completion_tokens", (json_int_t)u->completion_tokens);
    pk_int(p, "cached_tokens", (json_int_t)u->cached_tokens);
    pk_int(p, "reasoning_tokens", (json_int_t)u->reasoning_tokens);
    pk_int(p, "total_tokens", (json_int_t)u->total_tokens);
}

/* The object, or NULL when a value was refused (json_pack's failure). */
static inline json_t *pk_done(pk *p)
{
    if (!p->bad)
        return p->o;
    json_decref(p->o);
    return NULL;
}

#endif
