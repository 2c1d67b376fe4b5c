/*
 * Internal: the seam between the store's front (store.c) and its backends.
 *
 * The front owns everything that does not depend on the database: argument
 * checks, limits, ids, clocks, titles and the "plan" of a turn (which
 * message carries the status, which tool outcome and text offset belongs
 * to which message). A backend only moves rows in and out. A backend
 * embeds `loom_store` as its first member and fills `vt`; to add one
 * (PostgreSQL), implement loom__store_vtable and route a location prefix
 * to its open function in loom_store_open(). See docs/store.md.
 */
#ifndef LOOM_STORE_INTERNAL_H
#define LOOM_STORE_INTERNAL_H

#include "loom/accounts.h"
#include "loom/store.h"
#include "store/transcript.h"

/* A turn may hold at most this many messages, tool calls (over all its
 * messages), tool outcomes, call offsets and usage rows. */
#define LOOM__STORE_MAX_TURN_ITEMS 10000

/* Title length, in characters (UTF-8 code points). */
#define LOOM__STORE_TITLE_MAX LOOM_STORE_TITLE_MAX

/* "conv_" or "msg_" + 24 hex digits + NUL fits. */
#define LOOM__STORE_ID_SIZE LOOM_ID_SIZE

/* A memory to add, as the front has checked and prepared it. */
typedef struct {
    const char *user_id;
    const char *content;       /* trimmed */
    size_t content_len;
    const char *norm;          /* the dedup key (loom__store_memory_norm) */
    char id[LOOM__STORE_ID_SIZE]; /* the id, if it is new */
    int64_t now;               /* Unix ms */
    int64_t max_per_user;      /* refuse past this many */
} loom__store_memory;

/* The sums of a usage group, as loom_store_usage() names them, in the
 * order a backend reads them (usage.c). */
#define LOOM__STORE_USAGE_SUMS 9
extern const char *const loom__store_usage_sums[LOOM__STORE_USAGE_SUMS];

/* LOOM_EINVALID when a string of a turn's account is empty or longer
 * than LOOM_STORE_USER_ID_MAX bytes (usage.c). */
int loom__store_account_check(const loom_usage_account *a);

/* Where the store lives when loom_store_open() is given NULL. */
#define LOOM__STORE_DEFAULT_PATH "./data/loom.db"

/* One message of a planned turn, with everything resolved. */
typedef struct {
    char id[LOOM__STORE_ID_SIZE];
    const loom_message *msg;   /* borrowed from the turn, or the placeholder */
    int placeholder;           /* the empty assistant message the front adds */
    const char *status;        /* "ok", "error", "cancelled" */
    const char *error;         /* NULL unless this carries a failed status */
    const char *finish_reason; /* NULL unless this is the status carrier */
    const char *model;         /* assistant messages: the turn's model */
    const char *agent;         /* assistant messages: who wrote it */
    int has_tokens;
    long prompt_tokens;
    long completion_tokens;
    double cost;             /* < 0 unknown */
    int64_t cost_micros;     /* the same exactly; < 0 unknown */
    const char *tool_status; /* tool messages: "success", "error", NULL */
    double duration_ms;      /* tool messages: < 0 unknown */
    size_t offsets_at;       /* assistant: first of its calls in offsets */
    const char *citations;   /* the status carrier: JSON array, or NULL */
    char *parts;             /* its parts as JSON (store_parts.c), or NULL */
    size_t blobs_at;         /* its first blob in the plan's blob_refs */
    size_t blobs_len;        /* how many blobs it holds */
} loom__store_msg;

/* Hex digits of a SHA-256 and the NUL. */
#define LOOM__STORE_HASH_SIZE 65

/* An image's or file's bytes, stored once under their SHA-256. */
typedef struct {
    char hash[LOOM__STORE_HASH_SIZE]; /* lower-case hex */
    const char *mime;                 /* borrowed from the part, or NULL */
    unsigned char *data;              /* the decoded bytes, owned */
    size_t len;
} loom__store_blob;

/* Bytes kept of a tool record's tool, call id and status columns, and of
 * a string field of a cut record. */
#define LOOM__STORE_RECORD_FIELD_MAX 256

/* One tool record of a planned turn. The column strings are borrowed
 * from the turn's JSON and hold len bytes (not NUL-terminated). */
typedef struct {
    const char *tool, *call_id, *status; /* NULL when absent */
    size_t tool_len, call_id_len, status_len;
    double duration_ms; /* < 0 unknown */
    char *json;         /* the record as stored (owned by the plan) */
} loom__store_record;

/* A turn ready to write: messages in order (input, output, placeholder). */
typedef struct {
    const loom_turn_record *turn;
    loom__store_msg *msgs;
    size_t len;
    size_t *offsets; /* text offset of every tool call, message order */
    size_t offsets_len;
    char *title; /* NULL when the turn has no user text */
    int64_t now; /* Unix ms */
    char *citations; /* the turn's citations as JSON text, or NULL */
    char *plan_text; /* the turn's plan as JSON text, or NULL: keep */
    loom__store_record *records; /* the tool records, in order */
    size_t records_len;
    /* The turn's images and files sent as data, each hash once, and
     * which message holds which (msgs[i].blobs_at into blob_refs, whose
     * items index blobs). */
    loom__store_blob *blobs;
    size_t blobs_len;
    size_t *blob_refs;
    size_t blob_refs_len;
    /* turn->summary replaces the conversation's when not NULL. */
    /* The run's row: its status as the API names it ("completed",
     * "failed", "cancelled"), its usage (descendants included), its cost
     * (< 0 unknown) and when it started. A sub-agent's run
     * (turn->parent_run_id) writes msgs to run_messages instead of the
     * conversation's messages (no placeholder, no blobs). */
    const char *run_status;
    loom_usage run_usage;
    int64_t run_cost_micros;
    int64_t started_at;
} loom__store_plan;

/* ---- accounts ---------------------------------------------------------- */

#define LOOM__STORE_PEPPER_SIZE 32
#define LOOM__STORE_KEY_HASH_SIZE 32 /* HMAC-SHA256 */

/* An audit log entry to write. detail: JSON text or NULL. */
typedef struct {
    int64_t at; /* Unix ms */
    const char *actor, *action, *key_id, *workspace, *user, *detail;
} loom__store_audit;

/* A key to insert, as the front has checked and prepared it. */
typedef struct {
    char id[LOOM_KEY_ID_SIZE];
    unsigned char hash[LOOM__STORE_KEY_HASH_SIZE];
    const char *user, *workspace;
    int service;
    int64_t created_at, expires_at; /* expires_at 0: never */
    const char *models, *agents;    /* JSON arrays, or NULL: any */
    loom_limits limits;
    loom__store_audit audit; /* "key.created" */
} loom__store_key;

typedef struct {
    const char *name; /* "sqlite" */
    /* Closes everything; no call may be in flight. */
    void (*free)(loom_store *st);
    int (*ping)(loom_store *st);
    int (*schema_version)(loom_store *st);
    /* Inserts an empty conversation with this id. */
    /* Inserts an empty conversation with this id, owned by owner (NULL:
     * anonymous). */
    int (*conversation_create)(loom_store *st, const char *id,
                               const char *owner, int64_t now);
    int (*conversation_info)(loom_store *st, const char *id,
                             loom_conversation_info *out);
    /* limit is already checked (1..100). owner NULL: every
     * conversation; else only owner's (an `after` of another owner is
     * LOOM_ENOTFOUND). like NULL: any title; else a LIKE pattern
     * (escaped with '\\') the title matches. */
    int (*conversation_list)(loom_store *st, const char *owner,
                             const char *like, const char *after, int limit,
                             json_t **out);
    int (*conversation_get)(loom_store *st, const char *id, json_t **out);
    int (*conversation_delete)(loom_store *st, const char *id);
    /* title is checked and cleaned; LOOM_ENOTFOUND when absent. */
    int (*conversation_rename)(loom_store *st, const char *id,
                               const char *title);
    int (*load_history)(loom_store *st, const char *id, loom_messages *out);
    /* *summary NULL and *covers 0 when the conversation has none. */
    /* The summary, its coverage and the plan (JSON text); plan may be
     * NULL when not wanted. */
    int (*conversation_summary)(loom_store *st, const char *id,
                                char **summary, size_t *covers,
                                char **plan);
    /* Writes the plan in one transaction, all or nothing. The turn
     * extends the conversation's transcript hashes
     * (loom__transcript_add_turn); the first turn of an empty
     * conversation starts them (loom__transcript_init) and sets its owner
     * (turn->user_id); a conversation with messages but no hashes (from
     * before they existed) keeps none. */
    int (*save_turn)(loom_store *st, const loom__store_plan *plan);
    /*
     * Memories. Arguments and limits are checked by the front; every
     * call touches only user_id's rows. memory_add, in one transaction:
     * when the user has a memory with m->norm, touches its updated_at,
     * copies its id into id and sets *duplicate; else refuses with
     * LOOM_ETOOLARGE when the user has m->max_per_user memories, else
     * inserts m under m->id (copied into id).
     */
    int (*memory_add)(loom_store *st, const loom__store_memory *m,
                      char id[LOOM__STORE_ID_SIZE], int *duplicate);
    /* terms: the query's words (no quotes in them; nterms 0: the most
     * recent); limit is checked. *out as loom_store_memory_search. */
    int (*memory_search)(loom_store *st, const char *user_id,
                         const char *const *terms, size_t nterms, int limit,
                         json_t **out);
    int (*memory_delete)(loom_store *st, const char *user_id, const char *id);
    int (*memory_count)(loom_store *st, const char *user_id, int64_t *out);
    /* The id (*id_out, caller frees) of the most recently updated
     * conversation of user_id (NULL: anonymous) that has hash as either
     * transcript hash; LOOM_ENOTFOUND when none. */
    int (*conversation_match)(loom_store *st, const char *user_id,
                              const unsigned char *hash, char **id_out);
    /* Runs (docs/store.md#runs), as loom_store_run_get and
     * loom_store_run_children; ids and the user id are checked. */
    int (*run_get)(loom_store *st, const char *id, const char *user_id,
                   json_t **out);
    int (*run_children)(loom_store *st, const char *id, json_t **out);
    /* Research runs (docs/store.md#research-runs), as
     * loom_store_research_put, _get and _running; arguments checked. */
    int (*research_put)(loom_store *st, const loom_store_research_write *w,
                        int64_t now);
    int (*research_get)(loom_store *st, const char *run_id, const char *user_id,
                        int any_user, int events, json_t **out);
    int (*research_running)(loom_store *st, json_t **out);
    /*
     * Accounts (loom/accounts.h). The front checks names, makes ids,
     * secrets and hashes and writes the audit detail; a backend moves
     * rows. key_pepper: the pepper of key hashes; with create, made from
     * fresh (random, LOOM__STORE_PEPPER_SIZE bytes) when there is none
     * yet, else LOOM_ENOTFOUND when there is none.
     */
    int (*key_pepper)(loom_store *st, int create,
                      unsigned char out[LOOM__STORE_PEPPER_SIZE]);
    /* Inserts the key (and its user and workspace when new) and the
     * "key.created" audit entry, in one transaction. */
    int (*key_insert)(loom_store *st, const loom__store_key *k);
    /* Key id with its hash; LOOM_ENOTFOUND when absent. */
    int (*key_get)(loom_store *st, const char *id, loom_key_info *out,
                   unsigned char hash[LOOM__STORE_KEY_HASH_SIZE]);
    /* Sets revoked_at (when not set yet) and adds the audit entry a,
     * in one transaction; *out is the key after. */
    int (*key_revoke)(loom_store *st, const char *id,
                      const loom__store_audit *a, loom_key_info *out);
    /* Replaces the limits and adds the audit entry a. */
    int (*key_set_limits)(loom_store *st, const char *id, const loom_limits *l,
                          const loom__store_audit *a);
    /* Inserts a's workspace and user when new and then writes a (its
     * "user.created" entry), in one transaction; *created says whether
     * it did. */
    int (*user_ensure)(loom_store *st, const loom__store_audit *a,
                       int *created);
    int (*key_list)(loom_store *st, const char *workspace, const char *user,
                    json_t **out);
    int (*user_list)(loom_store *st, const char *workspace, json_t **out);
    int (*workspace_list)(loom_store *st, json_t **out);
    int (*audit_list)(loom_store *st, int limit, json_t **out);
    /* Limits of a user (user NULL: none asked) and of its workspace,
     * zero for none or when not stored (loom/limits.h). */
    int (*account_limits)(loom_store *st, const char *workspace,
                          const char *user, loom_limits *user_out,
                          loom_limits *workspace_out);
    /* Replaces the limits of user (NULL: of the workspace) and adds the
     * audit entry a, in one transaction; LOOM_ENOTFOUND when absent. */
    int (*account_set_limits)(loom_store *st, const char *workspace,
                              const char *user, const loom_limits *l,
                              const loom__store_audit *a);
    int (*audit_add)(loom_store *st, const loom__store_audit *a);
    /* A scope's spend in a budget period ("total", "day", "month" and
     * its start): get reads it (0 when none), add adds to it in one
     * statement (concurrent adds all count), list as
     * loom_store_spend_list. */
    int (*spend_get)(loom_store *st, const char *scope, const char *period,
                     int64_t period_start, int64_t *out);
    int (*spend_add)(loom_store *st, const char *scope, const char *period,
                     int64_t period_start, int64_t micros, int64_t now);
    int (*spend_list)(loom_store *st, const char *scope_prefix, json_t **out);
    /* The sealed credentials of an MCP server for user_id ("" for none):
     * *out (caller frees) and *len, LOOM_ENOTFOUND when there are none;
     * put replaces them. The bytes are opaque to the backend. */
    int (*mcp_credentials_get)(loom_store *st, const char *server,
                               const char *user_id, unsigned char **out,
                               size_t *len);
    int (*mcp_credentials_put)(loom_store *st, const char *server,
                               const char *user_id, const unsigned char *sealed,
                               size_t len, int64_t now);
    /* The sealed settings of user_id ("" for the anonymous user), as
     * the credentials above. */
    int (*user_settings_get)(loom_store *st, const char *user_id,
                             unsigned char **out, size_t *len);
    int (*user_settings_put)(loom_store *st, const char *user_id,
                             const unsigned char *sealed, size_t len,
                             int64_t now);
    /* The groups of q (checked by the front) as loom_store_usage's
     * "data", in one snapshot: the sums of at most `rows` of the rows it
     * selects (any of them), at most `groups` groups. */
    int (*usage)(loom_store *st, const loom_usage_query *q, long rows,
                 long groups, json_t **out);
    /* Makes branch_id, a branch of conversation id at its user message
     * message_id (loom_store_conversation_branch), in one transaction:
     * LOOM_ENOTFOUND for an unknown conversation, LOOM_EINVALID when
     * message_id is no user message of it. */
    int (*conversation_branch)(loom_store *st, const char *id,
                               const char *message_id, const char *branch_id,
                               int64_t now);
    /* Deletes the credentials of an MCP server for user_id; LOOM_ENOTFOUND
     * when there were none. */
    int (*mcp_credentials_delete)(loom_store *st, const char *server,
                                  const char *user_id);
    /* Fills *out (zeroed by the front): loom_store_stats_get. */
    void (*stats)(loom_store *st, loom_store_stats *out);
} loom__store_vtable;

struct loom_store {
    const loom__store_vtable *vt;
    /* The front's (secrets.c): the key file beside the database (NULL
     * when the location is not known) and the secret set with
     * loom_store_set_secret() (NULL: none). */
    char *key_file;
    char *secret;
};

/* Sets st's key file from the database's path (secrets.c). LOOM_ENOMEM. */
int loom__store_secrets_init(loom_store *st, const char *path);

/* The SQLite backend (sqlite.c); path has no "sqlite:" prefix. */
int loom__store_sqlite_open(loom_store **out, const char *path);

/* ---- helpers the front gives every backend ---------------------------- */

/*
 * The dedup key of a memory's text (loom_store_memory_add): ASCII blanks
 * and control characters collapsed to one space, ASCII letters
 * lower-cased, trimmed, trailing '.' and '!' dropped. Caller frees; NULL
 * when out of memory.
 */
char *loom__store_memory_norm(const char *text, size_t len);

/*
 * The words of a search query, in order: maximal runs of ASCII letters
 * and digits and of bytes >= 0x80 (UTF-8 text other than ASCII; the
 * tokenizer splits any punctuation inside them). *terms_out is one
 * allocation (free() it) holding the pointers and the words; *n_out may be
 * 0. LOOM_ENOMEM only.
 */
int loom__store_query_terms(const char *query, char ***terms_out,
                            size_t *n_out);

/* ---- images and files of messages (store_parts.c) -------------------- */

/*
 * Fills the parts JSON of every message of p that has parts, and p's
 * blobs and blob_refs from the images and files sent as data (base64
 * decoded, hashed, each hash once). LOOM_EINVALID for data that is not
 * base64, LOOM_ETOOLARGE for one past LOOM_STORE_PART_MAX_BYTES.
 */
int loom__store_plan_parts(loom__store_plan *p);
/* Frees what loom__store_plan_parts() put in p. */
void loom__store_plan_parts_free(loom__store_plan *p);

/*
 * How a backend hands over the bytes of the blob hash: *data (borrowed
 * until the next call or the end of the load) and *len; LOOM_EIO when the
 * blob is missing.
 */
typedef int (*loom__store_blob_get)(void *ctx, const char *hash,
                                    const void **data, size_t *len);

/*
 * Sets m's parts from json (len bytes, a parts column as
 * loom__store_plan_parts() wrote it), with each blob's bytes from get as
 * base64 again. LOOM_EIO for JSON the store did not write, a missing
 * blob or one past LOOM_STORE_PART_MAX_BYTES.
 */
int loom__store_parts_load(loom_message *m, const char *json, size_t len,
                           loom__store_blob_get get, void *ctx);

/*
 * Holds the history out->items[from..] to the media limits of one
 * request (LOOM_STORE_HISTORY_MEDIA_MAX, LOOM_STORE_HISTORY_MEDIA_BYTES):
 * counting from the newest message, an image or file past them becomes a
 * text part saying so. LOOM_ENOMEM only.
 */
int loom__store_history_limit(loom_messages *out, size_t from);

/* info as the JSON object the API shows. NULL when out of memory. */
json_t *loom__store_info_json(const loom_conversation_info *info);

#endif
