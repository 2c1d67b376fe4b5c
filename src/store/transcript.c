/*
 * The client-visible form of a conversation and its chained SHA-256 (see
 * transcript.h and docs/store.md#client-visible-form).
 *
 * One visible message is encoded as a role byte ('s', 'u', 'a', 't'),
 * its text, its tool calls and the call a tool message answers, every
 * string preceded by its length as 8 bytes little-endian and the calls by
 * their count, so no two different messages encode alike. The text is
 * the message's content (text parts joined by newlines; images and files
 * are not part of it); a missing content is the empty text. A call is its
 * id and its name: clients resend both as they got them, while some
 * re-serialise the arguments (whose id already pins them).
 */
#include "store/transcript.h"
#include "core/error.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Where the chains start: the hash of this text. Changing the encoding
 * means changing the text, so old hashes stop matching. */
#define TRANSCRIPT_TAG "loom client-visible transcript v1"

typedef struct {
    EVP_MD_CTX *ctx;
    int bad;
} digest;

static void put(digest *d, const void *p, size_t n)
{
    if (!d->bad && n && EVP_DigestUpdate(d->ctx, p, n) != 1)
        d->bad = 1;
}

static void put_len(digest *d, uint64_t n)
{
    unsigned char b[8];

    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(n >> (8 * i));
    put(d, b, sizeof(b));
}

static void put_str(digest *d, const char *s)
{
    size_t n = s ? strlen(s) : 0;

    put_len(d, n);
    put(d, s, n);
}

static char role_byte(loom_role r)
{
    switch (r) {
    case LOOM_ROLE_SYSTEM:
        return 's';
    case LOOM_ROLE_ASSISTANT:
        return 'a';
    case LOOM_ROLE_TOOL:
        return 't';
    default:
        return 'u';
    }
}

/* SHA-256, fetched from OpenSSL once (an implicit fetch at each digest
 * costs more than hashing a short message), and the hash of
 * TRANSCRIPT_TAG, where the chains start. */
static EVP_MD *sha256;
static unsigned char start[LOOM__TRANSCRIPT_HASH_SIZE];
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

static void setup(void)
{
    unsigned int n = 0;

    sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    /* A one-shot digest of a constant: it fails only when the library
     * itself is broken, and a zero start then still works. */
    if (EVP_Digest(TRANSCRIPT_TAG, strlen(TRANSCRIPT_TAG), start, &n,
                   sha256 ? sha256 : EVP_sha256(), NULL) != 1)
        memset(start, 0, sizeof(start));
}

/* A digest for the steps of one call (freed by digest_end). */
static int digest_begin(digest *d)
{
    pthread_once(&setup_once, setup);
    d->bad = 0;
    if (!(d->ctx = EVP_MD_CTX_new()))
        return loom__error_oom();
    return 0;
}

static void digest_end(digest *d)
{
    EVP_MD_CTX_free(d->ctx);
    d->ctx = NULL;
}

/* Starts the step from h: the previous hash, then the role. */
static void step_begin(digest *d, const unsigned char *h, loom_role role)
{
    char r = role_byte(role);

    d->bad = 0;
    if (EVP_DigestInit_ex(d->ctx, sha256 ? sha256 : EVP_sha256(), NULL) != 1)
        d->bad = 1;
    put(d, h, LOOM__TRANSCRIPT_HASH_SIZE);
    put(d, &r, 1);
}

/* Ends the step: the new hash into h (left alone on failure). */
static int step_end(digest *d, unsigned char *h)
{
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    if (d->bad || EVP_DigestFinal_ex(d->ctx, out, &n) != 1 ||
        n != LOOM__TRANSCRIPT_HASH_SIZE)
        return loom__error_set(LOOM_ERROR, "store: SHA-256 failed");
    memcpy(h, out, LOOM__TRANSCRIPT_HASH_SIZE);
    return 0;
}

void loom__transcript_init(loom__transcript *t)
{
    pthread_once(&setup_once, setup);
    memcpy(t->last, start, sizeof(t->last));
    memcpy(t->streamed, start, sizeof(t->streamed));
}

int loom__transcript_parted(const loom__transcript *t)
{
    return memcmp(t->last, t->streamed, sizeof(t->last)) != 0;
}

int loom__transcript_add(unsigned char h[LOOM__TRANSCRIPT_HASH_SIZE],
                         const loom_messages *m)
{
    digest d;
    int rc = 0;

    if (!m->len)
        return 0;
    if ((rc = digest_begin(&d)) != 0)
        return rc;
    for (size_t i = 0; i < m->len && rc == 0; i++) {
        const loom_message *msg = &m->items[i];
        step_begin(&d, h, msg->role);
        put_str(&d, msg->content);
        put_len(&d, msg->role == LOOM_ROLE_ASSISTANT ? msg->tool_calls_len : 0);
        for (size_t k = 0;
             msg->role == LOOM_ROLE_ASSISTANT && k < msg->tool_calls_len; k++) {
            put_str(&d, msg->tool_calls[k].id);
            put_str(&d, msg->tool_calls[k].name);
        }
        put_str(&d, msg->role == LOOM_ROLE_TOOL ? msg->tool_call_id : NULL);
        rc = step_end(&d, h);
    }
    digest_end(&d);
    return rc;
}

/* Whether a tool message of out answers call id (a server-run call). */
static int answered(const loom_messages *out, const char *id)
{
    for (size_t i = 0; i < out->len; i++)
        if (out->items[i].role == LOOM_ROLE_TOOL &&
            out->items[i].tool_call_id && id &&
            strcmp(out->items[i].tool_call_id, id) == 0)
            return 1;
    return 0;
}

/* The client's calls of out (those no tool message of out answers),
 * counted, or fed to d when d is not NULL. */
static size_t client_calls(const loom_messages *out, digest *d)
{
    size_t n = 0;

    for (size_t i = 0; i < out->len; i++) {
        const loom_message *msg = &out->items[i];
        if (msg->role != LOOM_ROLE_ASSISTANT)
            continue;
        for (size_t k = 0; k < msg->tool_calls_len; k++) {
            if (answered(out, msg->tool_calls[k].id))
                continue;
            n++;
            if (d) {
                put_str(d, msg->tool_calls[k].id);
                put_str(d, msg->tool_calls[k].name);
            }
        }
    }
    return n;
}

/* Whether out's two answers are the same text: no assistant message
 * but the last has any. */
static int one_text(const loom_messages *out)
{
    const loom_message *last = NULL;

    for (size_t i = 0; i < out->len; i++)
        if (out->items[i].role == LOOM_ROLE_ASSISTANT)
            last = &out->items[i];
    for (size_t i = 0; i < out->len; i++) {
        const loom_message *msg = &out->items[i];
        if (msg->role == LOOM_ROLE_ASSISTANT && msg != last && msg->content &&
            msg->content[0])
            return 0;
    }
    return 1;
}

/* Extends h by out as one answer: every assistant text joined (all) or
 * the last assistant message's. */
static int add_answer(unsigned char *h, const loom_messages *out, int all)
{
    const loom_message *last = NULL;
    uint64_t len = 0;
    digest d;
    int rc;

    for (size_t i = 0; i < out->len; i++) {
        const loom_message *msg = &out->items[i];
        if (msg->role != LOOM_ROLE_ASSISTANT)
            continue;
        last = msg;
        if (all && msg->content)
            len += strlen(msg->content);
    }
    if (!all && last && last->content)
        len = strlen(last->content);
    if ((rc = digest_begin(&d)) != 0)
        return rc;
    step_begin(&d, h, LOOM_ROLE_ASSISTANT);
    put_len(&d, len);
    for (size_t i = 0; i < out->len; i++) {
        const loom_message *msg = &out->items[i];
        if (msg->role == LOOM_ROLE_ASSISTANT && msg->content &&
            (all || msg == last))
            put(&d, msg->content, strlen(msg->content));
    }
    put_len(&d, client_calls(out, NULL));
    client_calls(out, &d);
    put_str(&d, NULL);
    rc = step_end(&d, h);
    digest_end(&d);
    return rc;
}

int loom__transcript_add_turn(loom__transcript *t, const loom_messages *input,
                              const loom_messages *output)
{
    static const loom_messages none = {NULL, 0, 0};
    loom__transcript n = *t;
    int rc = 0;

    if (!output)
        output = &none;
    /* The input extends both chains alike: hashed once when they are
     * at the same point (they differ only after an answer whose model
     * spoke before calling loom's tools). */
    if (input && (rc = loom__transcript_add(n.last, input)) == 0) {
        if (!loom__transcript_parted(t))
            memcpy(n.streamed, n.last, sizeof(n.streamed));
        else
            rc = loom__transcript_add(n.streamed, input);
    }
    if (rc != 0 || (rc = add_answer(n.last, output, 0)) != 0)
        return rc;
    /* So does the answer when both forms of it are the same text. */
    if (!loom__transcript_parted(t) && one_text(output))
        memcpy(n.streamed, n.last, sizeof(n.streamed));
    else if ((rc = add_answer(n.streamed, output, 1)) != 0)
        return rc;
    *t = n;
    return 0;
}
