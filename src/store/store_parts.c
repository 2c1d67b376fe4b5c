/*
 * Images and files of stored messages: the front's half of keeping them
 * (store_internal.h), shared by every backend.
 *
 * On save, a message's parts become JSON text for its parts column, and
 * each image or file sent as data becomes a blob: its decoded bytes under
 * the SHA-256 of those bytes. The bytes are then stored once however many
 * messages or conversations hold them, and the JSON holds only the hash
 * and the size; a part given by URL keeps its URL. On load the parts come
 * back from that JSON with each blob's bytes as base64 again, so a
 * continued conversation shows the model the same images, and the history
 * as a whole is held to the media limits of one request.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "store/store_internal.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The text that stands in for an image or file left out of a history. */
#define LEFT_OUT                                                               \
    "[an earlier image or file was left out: a history holds at most 32 of "   \
    "them, 20 MiB together]"

static const char *const kind_names[] = {"text", "image", "file"};

/* ---- saving ------------------------------------------------------------ */

/* Decodes base64 b64 into *out (*len bytes; caller frees). LOOM_EINVALID
 * when it is not base64; blanks at its end are ignored. */
static int decode(const char *b64, unsigned char **out, size_t *len)
{
    size_t n = strlen(b64), pad = 0;
    int got;

    *out = NULL;
    *len = 0;
    while (n && (b64[n - 1] == '\n' || b64[n - 1] == '\r' || b64[n - 1] == ' '))
        n--;
    if (n % 4 || n > (size_t)INT32_MAX)
        return loom__error_set(LOOM_EINVALID, "store: a part's data is not "
                                              "base64");
    while (pad < 2 && pad < n && b64[n - 1 - pad] == '=')
        pad++;
    if (!(*out = malloc(n / 4 * 3 + 1)))
        return loom__error_oom();
    got = EVP_DecodeBlock(*out, (const unsigned char *)b64, (int)n);
    if (got < 0 || (size_t)got < pad) {
        free(*out);
        *out = NULL;
        return loom__error_set(LOOM_EINVALID, "store: a part's data is not "
                                              "base64");
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    *len = (size_t)got - pad;
    return 0;
}

/* The SHA-256 of len bytes of data as lower-case hex into hash. */
static int sha256_hex(const unsigned char *data, size_t len,
                      char hash[LOOM__STORE_HASH_SIZE])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    if (!EVP_Digest(data, len, md, &n, EVP_sha256(), NULL) || n != 32)
        return loom__error_set(LOOM_ERROR, "store: SHA-256 failed");
    for (unsigned int i = 0; i < n; i++)
        snprintf(hash + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* Sets key of o to the string s when s is not NULL; 1 on failure. */
static int put_opt(json_t *o, const char *key, const char *s)
{
    json_t *v;

    if (!s)
        return 0;
    v = loom__json_text(s, strlen(s));
    return !v || json_object_set_new(o, key, v) != 0;
}

/*
 * The blob of the data part p of message at, found in or added to p's
 * blobs; its index into *idx. The decoded bytes are checked against the
 * limit.
 */
static int add_blob(loom__store_plan *p, const loom_part *part, size_t at,
                    size_t *idx)
{
    loom__store_blob b = {0}, *grown;
    int rc;

    if ((rc = decode(part->data, &b.data, &b.len)) != 0)
        return rc;
    if (b.len > LOOM_STORE_PART_MAX_BYTES) {
        free(b.data);
        return loom__error_set(LOOM_ETOOLARGE,
                               "message %zu holds an image or file of %zu "
                               "bytes; at most %d are stored; nothing was "
                               "saved",
                               at, b.len, LOOM_STORE_PART_MAX_BYTES);
    }
    if ((rc = sha256_hex(b.data, b.len, b.hash)) != 0) {
        free(b.data);
        return rc;
    }
    for (size_t i = 0; i < p->blobs_len; i++)
        if (strcmp(p->blobs[i].hash, b.hash) == 0) {
            free(b.data);
            *idx = i;
            return 0;
        }
    grown = realloc(p->blobs, (p->blobs_len + 1) * sizeof(*grown));
    if (!grown) {
        free(b.data);
        return loom__error_oom();
    }
    p->blobs = grown;
    b.mime = part->mime;
    *idx = p->blobs_len;
    p->blobs[p->blobs_len++] = b;
    return 0;
}

/* Part k of message at as stored: text, a URL, or a blob's hash. */
static json_t *part_json(loom__store_plan *p, const loom_part *part, size_t at,
                         int *rc)
{
    json_t *o = json_pack("{s:s}", "type", kind_names[part->kind % 3]);
    size_t idx = 0, *refs;

    *rc = 0;
    if (!o)
        goto oom;
    if (part->kind == LOOM_PART_TEXT) {
        if (put_opt(o, "text", part->text ? part->text : ""))
            goto oom;
        return o;
    }
    if (put_opt(o, "url", part->url) || put_opt(o, "mime", part->mime) ||
        put_opt(o, "detail", part->detail) ||
        put_opt(o, "filename", part->filename))
        goto oom;
    if (!part->data)
        return o;
    if ((*rc = add_blob(p, part, at, &idx)) != 0) {
        json_decref(o);
        return NULL;
    }
    refs = realloc(p->blob_refs, (p->blob_refs_len + 1) * sizeof(*refs));
    if (!refs)
        goto oom;
    p->blob_refs = refs;
    refs[p->blob_refs_len++] = idx;
    p->msgs[at].blobs_len++;
    if (put_opt(o, "hash", p->blobs[idx].hash) ||
        json_object_set_new(o, "bytes",
                            json_integer((json_int_t)p->blobs[idx].len)))
        goto oom;
    return o;
oom:
    json_decref(o);
    *rc = loom__error_oom();
    return NULL;
}

int loom__store_plan_parts(loom__store_plan *p)
{
    for (size_t i = 0; i < p->len; i++) {
        loom__store_msg *m = &p->msgs[i];
        json_t *arr;
        int rc = 0;

        m->blobs_at = p->blob_refs_len;
        if (!m->msg->parts_len)
            continue;
        if (!(arr = json_array()))
            return loom__error_oom();
        for (size_t k = 0; !rc && k < m->msg->parts_len; k++) {
            json_t *o = part_json(p, &m->msg->parts[k], i, &rc);
            if (!rc && json_array_append_new(arr, o))
                rc = loom__error_oom();
        }
        if (!rc && !(m->parts = json_dumps(arr, JSON_COMPACT)))
            rc = loom__error_oom();
        json_decref(arr);
        if (rc)
            return rc;
    }
    return 0;
}

void loom__store_plan_parts_free(loom__store_plan *p)
{
    for (size_t i = 0; p->msgs && i < p->len; i++)
        free(p->msgs[i].parts);
    for (size_t i = 0; i < p->blobs_len; i++)
        free(p->blobs[i].data);
    free(p->blobs);
    free(p->blob_refs);
}

/* ---- loading ------------------------------------------------------------ */

static int damaged(const char *what)
{
    return loom__error_set(LOOM_EIO,
                           "store: a message's parts are damaged "
                           "(%s)",
                           what);
}

/* A copy of the string at key of o into *out (NULL when absent). */
static int dup_key(char **out, const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);

    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return damaged(key);
    if (!(*out = strdup(json_string_value(v))))
        return loom__error_oom();
    return 0;
}

/* The bytes of the blob hash, from get, as base64 into part->data. */
static int load_blob(loom_part *part, const char *hash,
                     loom__store_blob_get get, void *ctx)
{
    const void *data = NULL;
    size_t len = 0;
    int rc;

    if ((rc = get(ctx, hash, &data, &len)) != 0)
        return rc;
    if (len > LOOM_STORE_PART_MAX_BYTES)
        return damaged("a blob past the size limit");
    if (!(part->data = malloc((len + 2) / 3 * 4 + 1)))
        return loom__error_oom();
    EVP_EncodeBlock((unsigned char *)part->data, data, (int)len);
    return 0;
}

static int load_part(loom_part *part, const json_t *o, loom__store_blob_get get,
                     void *ctx)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    const char *hash = json_string_value(json_object_get(o, "hash"));
    int rc;

    if (!type)
        return damaged("a part without a type");
    if (strcmp(type, "text") == 0) {
        part->kind = LOOM_PART_TEXT;
        return dup_key(&part->text, o, "text");
    }
    if (strcmp(type, "image") != 0 && strcmp(type, "file") != 0)
        return damaged(type);
    part->kind = type[0] == 'i' ? LOOM_PART_IMAGE : LOOM_PART_FILE;
    if ((rc = dup_key(&part->url, o, "url")) != 0 ||
        (rc = dup_key(&part->mime, o, "mime")) != 0 ||
        (rc = dup_key(&part->detail, o, "detail")) != 0 ||
        (rc = dup_key(&part->filename, o, "filename")) != 0)
        return rc;
    if (!hash == !part->url)
        return damaged("a part needs a url or a hash");
    return hash ? load_blob(part, hash, get, ctx) : 0;
}

int loom__store_parts_load(loom_message *m, const char *json, size_t len,
                           loom__store_blob_get get, void *ctx)
{
    json_t *arr = json_loadb(json, len, 0, NULL);
    size_t n = json_array_size(arr);
    int rc = 0;

    if (!json_is_array(arr) || !n) {
        json_decref(arr);
        return damaged("not a JSON array");
    }
    if (!(m->parts = calloc(n, sizeof(*m->parts)))) {
        json_decref(arr);
        return loom__error_oom();
    }
    m->parts_len = n;
    for (size_t k = 0; !rc && k < n; k++)
        rc = load_part(&m->parts[k], json_array_get(arr, k), get, ctx);
    json_decref(arr);
    return rc;
}

/* ---- the history's limits ----------------------------------------------- */

/* Turns part into the text that says it was left out. */
static int leave_out(loom_part *part)
{
    char *note = strdup(LEFT_OUT);

    if (!note)
        return loom__error_oom();
    loom_part_clear(part);
    part->kind = LOOM_PART_TEXT;
    part->text = note;
    return 0;
}

int loom__store_history_limit(loom_messages *out, size_t from)
{
    size_t count = 0, bytes = 0;

    for (size_t i = out->len; i-- > from;) {
        loom_message *m = &out->items[i];
        for (size_t k = m->parts_len; k-- > 0;) {
            loom_part *part = &m->parts[k];
            size_t size = loom_part_data_size(part);
            int rc;
            if (part->kind == LOOM_PART_TEXT)
                continue;
            if (count < LOOM_STORE_HISTORY_MEDIA_MAX &&
                size <= LOOM_STORE_HISTORY_MEDIA_BYTES - bytes) {
                count++;
                bytes += size;
                continue;
            }
            if ((rc = leave_out(part)) != 0)
                return rc;
        }
    }
    return 0;
}
