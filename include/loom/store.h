/*
 * loom/store.h: conversations, turns, usage and users' memories, behind
 * one interface.
 *
 * A store keeps conversations: their messages (with reasoning, model,
 * finish reason, status and token counts), the tool calls inside
 * assistant messages (with the offset in the assistant text where each
 * call appeared), tool outputs (status, duration), one usage row per
 * model call and one row per run (a sub-agent's linked to its parent,
 * with its own messages), and each user's memories (searchable with full-text
 * search). SQLite (WAL, one file) is the first backend; the interface
 * is shaped so a PostgreSQL backend can follow without touching callers.
 *
 * Persistence is final-only: a run buffers its turn and hands it to
 * loom_store_save_turn() once, at the end, which writes it in one
 * transaction. A failed or cancelled turn is saved too, marked so.
 *
 * With a turn also go the context engine's summary of older messages
 * (kept with the conversation, handed to the next run), the sources the
 * answer cites (kept on the answer) and the record of every tool call
 * (tool.metric, kept per conversation).
 *
 * Threads: a store may be used from any number of threads at once (each
 * call takes what it needs; SQLite connections are per thread or pooled
 * inside the backend).
 */
#ifndef LOOM_STORE_H
#define LOOM_STORE_H

#include "common.h"
#include "message.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_store loom_store;

/*
 * Opens the store at location: a file path for SQLite ("./data/loom.db";
 * "sqlite:" prefix optional; parent folders are created). Creates the
 * schema or migrates an older one (versioned migrations, recorded in the
 * database). LOOM_EIO when the file cannot be opened, LOOM_EINVALID when
 * the schema is newer than this loom knows.
 */
int loom_store_open(loom_store **out, const char *location);
/* NULL is a no-op. */
void loom_store_free(loom_store *st);
/* 0 when the store answers a trivial query (for /readyz). */
int loom_store_ping(loom_store *st);
/* The schema version in use. */
int loom_store_schema_version(loom_store *st);

/* What the store has written since it opened (loom serve's /metrics).
 * The counters only grow. */
typedef struct {
    uint64_t commits;      /* transactions committed, by any writer */
    uint64_t batches;      /* group commits of queued writes (turns) */
    uint64_t batched;      /* writes committed in them */
    uint64_t checkpoints;  /* checkpoints that copied WAL pages back */
    uint64_t wal_restarts; /* times the WAL file was started over */
    /* Time writes waited while the writer started the WAL over. */
    double wal_restart_seconds;
    int64_t wal_pages; /* pages in the WAL after the newest commit */
} loom_store_stats;

/* Fills *out; LOOM_EINVALID for a NULL argument. */
int loom_store_stats_get(loom_store *st, loom_store_stats *out);

/* A conversation's summary. Strings owned by the struct. */
typedef struct {
    char *id;       /* "conv_" + 24 hex digits */
    char *title;    /* first user text, cut to 80 characters; may be "" */
    char *agent;    /* agent of the last turn, may be NULL */
    char *model;    /* model of the last turn, may be NULL */
    int64_t created_at; /* Unix milliseconds */
    int64_t updated_at;
    int64_t message_count;
    char *user_id; /* its owner (loom_turn_record.user_id); NULL: none */
} loom_conversation_info;

void loom_conversation_info_clear(loom_conversation_info *c);

/* Creates an empty conversation; *id_out (caller frees) is its id. */
int loom_store_conversation_create(loom_store *st, char **id_out);

/*
 * Creates an empty conversation whose id the caller chose (with
 * loom_id_new(id, "conv_"), say), so that a caller can announce the id
 * before the write happens (a server sends it in a header, then creates
 * the conversation on the turn's thread). An id of at most LOOM_ID_MAX
 * bytes. LOOM_EIO when the write fails (the store was busy beyond its
 * busy timeout, the disk is full); LOOM_ERROR when the id is taken.
 */
int loom_store_conversation_create_id(loom_store *st, const char *id);

/*
 * loom_store_conversation_create_id, owned from the start by user_id
 * (NULL: anonymous; else 1 to LOOM_STORE_USER_ID_MAX bytes), so that an
 * owner-scoped reader finds it before its first turn is stored.
 * LOOM_EINVALID for a bad user id.
 */
int loom_store_conversation_create_for(loom_store *st, const char *id,
                                       const char *user_id);
/* LOOM_ENOTFOUND when absent. */
int loom_store_conversation_info(loom_store *st, const char *id,
                                 loom_conversation_info *out);
/*
 * Lists conversations newest first (by updated_at, then id), at most
 * limit (1..100) of them, starting after the conversation whose id is
 * `after` (NULL: from the newest). *out is a JSON object:
 * {"data": [info...], "has_more": bool, "next": id or null}.
 */
int loom_store_conversation_list(loom_store *st, const char *after,
                                 int limit, json_t **out);
/*
 * loom_store_conversation_list for user_id's conversations only (not
 * NULL). An `after` that is another user's conversation is
 * LOOM_ENOTFOUND, like an unknown one.
 */
int loom_store_conversation_list_owned(loom_store *st, const char *user_id,
                                       const char *after, int limit,
                                       json_t **out);
/*
 * The whole conversation as JSON: the info fields, "summary" (the
 * stored context summary or null) and "summary_covers", plus "messages":
 * each {id, role, content, reasoning, model, finish_reason, status, error,
 * prompt_tokens, completion_tokens, cost, created_at, run_id,
 * tool_calls: [{id, name, arguments, text_offset}] and citations (the
 * array saved with the turn, null when none) (assistant messages),
 * tool_call_id, name, tool_status, duration_ms (tool messages), and
 * "parts" for a message that holds images or files: [{type: "text",
 * text} or {type: "image" or "file", url or hash (SHA-256 hex) and
 * bytes, mime, detail, filename}], never the bytes themselves}; the
 * message that carries a turn's status has the whole turn's tokens
 * (every model call summed) beside the whole turn's cost,
 * "usage": [{run_id, model, iteration, prompt_tokens,
 * completion_tokens, cached_tokens, reasoning_tokens, total_tokens,
 * cost, agent}] (its sub-agents' calls included, under their run ids)
 * and "tool_records": every tool record saved, oldest first, as saved
 * plus "run_id". LOOM_ENOTFOUND when absent.
 */
int loom_store_conversation_get(loom_store *st, const char *id,
                                json_t **out);
/*
 * Finds the conversation that a client resending its whole history (and
 * no conversation id) continues: the one of user_id (NULL: the anonymous
 * ones only; a user never finds another's) whose messages, in the form a
 * client sees them, are exactly `messages` (docs/store.md#client-visible-
 * form: the client's own messages as sent, one assistant answer per turn
 * with the tool calls the client must answer, loom's own tool calls and
 * results left out). messages are taken as a client sends them. Matched
 * by a hash kept with each conversation and extended by every stored
 * turn; a conversation stored before that hash existed is never found.
 * When several match, the most recently updated. *id_out (caller frees)
 * is its id. LOOM_ENOTFOUND when none matches (also for no messages),
 * LOOM_EINVALID for a bad user id. A read only.
 */
int loom_store_conversation_match(loom_store *st, const char *user_id,
                                  const loom_messages *messages, char **id_out);
/* Deletes it with everything it holds, its branches included.
 * LOOM_ENOTFOUND when absent. */
int loom_store_conversation_delete(loom_store *st, const char *id);
/*
 * Makes a branch of conversation id to edit its user message message_id
 * (docs/store.md#branches): a new conversation, *id_out (caller frees),
 * of the same owner, title, agent and model, whose history is a copy of
 * id's messages before message_id (with their tool calls, outcomes,
 * images and files; the summary when it covers no more than them; no
 * plan), to which the caller's next turn adds the edited message. The
 * branch is left out of conversation lists; loom_store_conversation_get
 * of it or of id shows, on each user message with more than one version,
 * "versions": the ids of the conversations holding each version (the
 * original's first, then branches oldest first) and "version": the index
 * of the one that conversation shows; and "parent_id" and "fork_message"
 * (null for a conversation that is no branch). Deleting a conversation
 * deletes its branches. LOOM_ENOTFOUND for an unknown conversation,
 * LOOM_EINVALID when message_id is no user message of it.
 */
int loom_store_conversation_branch(loom_store *st, const char *id,
                                   const char *message_id, char **id_out);
/*
 * loom_store_conversation_list of user_id's conversations (NULL:
 * everyone's) whose title holds query (case-insensitive for ASCII
 * letters; NULL or "": every one), at most LOOM_STORE_QUERY_MAX_BYTES.
 */
int loom_store_conversation_search(loom_store *st, const char *user_id,
                                   const char *query, const char *after,
                                   int limit, json_t **out);
/*
 * Gives the conversation a title (a later turn keeps it): on one line
 * (control characters become spaces, runs of blanks one space),
 * trimmed, cut to LOOM_STORE_TITLE_MAX characters. LOOM_EINVALID for a
 * title over LOOM_STORE_TITLE_MAX_BYTES or with nothing visible,
 * LOOM_ENOTFOUND when absent. Its updated_at stays: a rename does not
 * move it up a list.
 */
int loom_store_conversation_rename(loom_store *st, const char *id,
                                   const char *title);

/*
 * The context summary stored with the conversation by its latest turn
 * that had one (loom_turn_record.summary), for the next run's
 * loom_run_context_options.summary: *summary_out (caller frees) is NULL
 * when there is none, and *covers_out (may be NULL) how many messages it
 * replaces, counted as loom_store_load_history() gives them (0 with no
 * summary). LOOM_ENOTFOUND for an unknown conversation.
 */
int loom_store_conversation_summary(loom_store *st, const char *id,
                                    char **summary_out, size_t *covers_out);

/*
 * The plan stored with the conversation by its latest turn that had one
 * (loom_turn_record.plan), for the next run's loom_run_options.plan: *plan_out
 * (a new reference) is NULL when there is none. LOOM_ENOTFOUND for an
 * unknown conversation.
 */
int loom_store_conversation_plan(loom_store *st, const char *id,
                                 json_t **plan_out);

/*
 * Loads the conversation's messages in order into out (appended), as the
 * run loop needs them: user, assistant (with tool calls and reasoning),
 * tool results. Messages of failed or cancelled turns are included with
 * whatever text they had. Images and files come back as parts, those
 * sent as data with their bytes, within LOOM_STORE_HISTORY_MEDIA_MAX and
 * LOOM_STORE_HISTORY_MEDIA_BYTES (the newest kept). LOOM_ENOTFOUND when
 * absent.
 */
int loom_store_load_history(loom_store *st, const char *id,
                            loom_messages *out);

typedef enum {
    LOOM_TURN_OK = 0,
    LOOM_TURN_ERROR,
    LOOM_TURN_CANCELLED
} loom_turn_record_status;

const char *loom_turn_status_name(loom_turn_record_status s);

/* Per tool result: how it went. Indexed like the tool messages. */
typedef struct {
    const char *tool_call_id;
    int failed;
    double duration_ms;
} loom_turn_tool;

/* Per assistant tool call: where in the assistant text it appeared. */
typedef struct {
    const char *tool_call_id;
    size_t text_offset; /* bytes of assistant text before the call */
} loom_turn_call;

/* One model call's usage. */
typedef struct {
    int iteration;
    loom_usage usage;
    double cost; /* < 0 when unknown */
    /* The model that answered this call (a router may have fallen back);
     * NULL: the turn's model. */
    const char *model;
    /* The agent that made this call; NULL: the turn's agent. */
    const char *agent;
} loom_turn_usage;

/*
 * Whom a turn's model calls are counted to (docs/accounts.md#usage),
 * beside its owner (loom_turn_record.user_id): kept on each of its usage
 * rows for loom_store_usage(). Every field may be NULL (none); each has
 * at most LOOM_STORE_USER_ID_MAX bytes. Borrowed.
 */
typedef struct {
    const char *key_id;    /* the API key the turn came with */
    const char *workspace; /* the key's workspace */
    const char *user;      /* the account's user (a service key's service) */
    const char *end_user;  /* the end user a service key acts for */
} loom_usage_account;

/*
 * One turn: the new input messages (usually one user message) and what
 * the run added. Everything is borrowed for the call.
 */
typedef struct {
    const char *conversation_id; /* must exist */
    const char *run_id;
    /*
     * The user the turn is for (NULL: anonymous; else 1 to
     * LOOM_STORE_USER_ID_MAX bytes). A conversation's first stored turn
     * makes that user its owner, for whom loom_store_conversation_match()
     * finds it; later turns leave the owner alone.
     */
    const char *user_id;
    const char *agent;           /* may be NULL */
    const char *model;           /* "provider/model" */
    const loom_messages *input;  /* new user/system/tool messages */
    const loom_messages *output; /* assistant and tool messages */
    /* Per output message, the agent that wrote it (handoffs change it
     * within a turn; loom_run_message_agent); NULL, or a NULL entry:
     * agent. Kept on assistant messages. */
    const char *const *output_agents;
    /* Per output message, the model that wrote it (a handoff or a
     * get_model hook changes it within a turn; loom_run_message_model);
     * NULL, or a NULL entry: model. Kept on assistant messages. */
    const char *const *output_models;
    loom_turn_record_status status;
    const char *error;           /* reason, for ERROR/CANCELLED */
    const char *finish_reason;   /* of the last model call, may be NULL */
    const loom_turn_tool *tools; /* may be NULL */
    size_t tools_len;
    const loom_turn_call *calls; /* may be NULL */
    size_t calls_len;
    const loom_turn_usage *usage; /* may be NULL */
    size_t usage_len;
    double cost; /* total, < 0 when unknown */
    /*
     * The context summary the run made (loom_run_summary) and how many
     * messages it replaces, counted as loom_store_load_history() will
     * give them once this turn is saved (history, then input, then
     * output). Replaces the conversation's summary; NULL keeps the one it
     * has. At most LOOM_STORE_SUMMARY_MAX_BYTES.
     */
    const char *summary;
    size_t summary_covers;
    /*
     * The sources the answer cites: a JSON array of objects (the data of
     * the run's `citation` events, docs/citations.md), kept on the
     * turn's last assistant message. NULL or empty: none. At most
     * LOOM_STORE_CITATIONS_MAX of them, LOOM_STORE_CITATIONS_MAX_BYTES
     * as JSON.
     */
    const json_t *citations;
    /*
     * The run's tool records: a JSON array of objects (the data of its
     * `tool.metric` events, docs/events.md), kept in order. NULL: none.
     * At most LOOM_STORE_TOOL_RECORDS_MAX of them; one over
     * LOOM_STORE_TOOL_RECORD_MAX_BYTES as JSON is kept cut (its short
     * top-level fields and "record_cut": true, "record_bytes": size).
     */
    const json_t *tool_records;
    /*
     * The run's plan (loom_run_plan: a JSON object, see todo_write in
     * docs/tools.md), kept with the conversation for the next run's
     * loom_run_options.plan. NULL: keep what the conversation has. At
     * most LOOM_STORE_PLAN_MAX_BYTES as JSON.
     */
    const json_t *plan;
    /*
     * A title for the conversation (loom_run_title), used when the
     * conversation has none yet; NULL: the first words of the turn's
     * user text. Cut to LOOM_STORE_TITLE_MAX characters.
     */
    const char *title;
    /*
     * The run itself: every saved turn leaves one `runs` row
     * (docs/store.md#runs). parent_run_id NULL: a top-level run, whose
     * messages join the conversation. Else a sub-agent's run (at most
     * LOOM_ID_MAX bytes each id): conversation_id is its top-level run's
     * conversation, which gets none of its messages; input and output
     * are kept with the run (text, reasoning, tool calls and results;
     * not images or files), its usage rows go to the conversation's
     * with its run id; its citations, summary, plan and tool records are
     * not stored here (its records reach the conversation with its
     * parent's turn), nor does it change the conversation.
     */
    const char *parent_run_id;
    const char *parent_call_id; /* the parent's call that started it */
    int depth;                  /* 0 at the top */
    /* The run's usage, its descendants' included (loom_run_usage), and
     * whether its cost is known (loom_run_cost_known). NULL: the sum of
     * the usage rows, its cost known when every row is priced. */
    const loom_usage *run_usage;
    int run_cost_known;
    int64_t started_at; /* Unix ms; 0: when saved */
    /* Whom its usage rows are counted to (a sub-agent's run: its top
     * run's); zero: no one beyond user_id. */
    loom_usage_account account;
    /*
     * The save creates the conversation too: conversation_id (1 to 128
     * bytes) names a new one that does not exist yet. In the same
     * transaction and before the rows that refer to it, it writes the
     * row loom_store_conversation_create_for(conversation_id, user_id)
     * would have written, created at started_at (0: when saved); a save
     * that fails leaves no conversation behind. LOOM_ERROR when the id
     * is taken; a sub-agent's run (parent_run_id) cannot:
     * LOOM_EINVALID.
     */
    int create_conversation;
} loom_turn_record;

/* Limits of a turn's extras; crossing one is an error (LOOM_ETOOLARGE,
 * nothing written) except a tool record's size, which is cut. */
/* A conversation's title, in characters (UTF-8 code points). */
#define LOOM_STORE_TITLE_MAX 80
/* A title given to loom_store_conversation_rename, and a title search,
 * in bytes. */
#define LOOM_STORE_TITLE_MAX_BYTES 4096
#define LOOM_STORE_QUERY_MAX_BYTES 400
#define LOOM_STORE_SUMMARY_MAX_BYTES (256 * 1024)   /* a summary */
#define LOOM_STORE_PLAN_MAX_BYTES (256 * 1024)      /* a plan, as JSON */
#define LOOM_STORE_CITATIONS_MAX 1000               /* citations of a turn */
#define LOOM_STORE_CITATIONS_MAX_BYTES (8 * 1024 * 1024) /* as JSON */
#define LOOM_STORE_TOOL_RECORDS_MAX 10000           /* records of a turn */
#define LOOM_STORE_TOOL_RECORD_MAX_BYTES (64 * 1024) /* one record, JSON */
/* An image or file a message holds as data, decoded. */
#define LOOM_STORE_PART_MAX_BYTES (8 * 1024 * 1024)
/* What loom_store_load_history() gives back at most, newest first: images
 * and files past these become a text part saying they were left out. */
#define LOOM_STORE_HISTORY_MEDIA_MAX 32
#define LOOM_STORE_HISTORY_MEDIA_BYTES (20 * 1024 * 1024)

/*
 * Writes the turn in one transaction: all of it or nothing. The status,
 * error, finish reason and citations land on the last assistant message
 * (or, with no assistant message, on a stored empty assistant message, so
 * a failed turn is always visible); the summary on the conversation; the
 * tool records in their own rows. LOOM_ENOTFOUND for an unknown
 * conversation, LOOM_EINVALID for a malformed turn (citations or tool
 * records not an array of objects), LOOM_ETOOLARGE past a limit,
 * LOOM_EIO when the write fails (disk full, ...): nothing is written then.
 */
int loom_store_save_turn(loom_store *st, const loom_turn_record *turn);

/*
 * A stored run (docs/store.md#runs) as JSON, for user_id: a run whose
 * user is another (NULL matches only runs without a user) is
 * LOOM_ENOTFOUND, as is an unknown id. *out: {"id", "object": "run",
 * "conversation_id", "parent_run_id", "parent_call_id", "depth",
 * "agent", "model", "status" ("completed", "failed", "cancelled"),
 * "error" (null or {"message"}), "finish_reason", "usage" (the token
 * counts, cache_write_tokens, cost_micros: null when unknown; the run's
 * descendants included), "created_at", "ended_at", "stored": true,
 * "children" (as loom_store_run_children) and, for a sub-agent's run,
 * "messages": [{role, content, reasoning, agent, tool_calls: [{id,
 * name, arguments}] or null, tool_call_id, name, tool_status,
 * duration_ms, created_at}] in order. A read only.
 */
int loom_store_run_get(loom_store *st, const char *id, const char *user_id,
                       json_t **out);

/*
 * The stored runs whose parent is run id (one level: each child's own
 * children are read with its id), oldest first: *out is an array of
 * {"id", "agent", "model", "status", "error", "depth", "parent_call_id",
 * "usage", "created_at", "ended_at"}; [] when none (also for an
 * unknown id). Not scoped to a user: the caller has checked the
 * parent's. A read only.
 */
int loom_store_run_children(loom_store *st, const char *id, json_t **out);

/*
 * Research runs (docs/store.md#research-runs): what a research run keeps
 * as it goes, so that one interrupted by a stop resumes from it.
 *
 * One write, in one transaction (all or nothing); every member but
 * run_id may be left zero:
 *   - begin: conversation_id and spec (JSON text: the request) make the
 *     run's row, status running, owned by user_id (NULL: anonymous);
 *   - a step: phase (with cycle and max_cycles), state (JSON text), plan
 *     replace what the row holds; messages (JSON texts) are appended at
 *     positions first_position, first_position + 1, ...;
 *   - a researcher: researcher (JSON text of an object with "call_id",
 *     "task", "status": running, completed or failed, and what else its
 *     caller keeps) is inserted or replaced;
 *   - an event: event_seq > 0 with event (its JSON text);
 *   - the end: end marks the run ended, with its report and citations
 *     (JSON text) when given.
 * LOOM_ENOTFOUND when the run (or, for begin, the conversation) does not
 * exist, LOOM_EEXISTS for a begin or an event seq written before,
 * LOOM_EINVALID for a missing run_id or malformed JSON, LOOM_EIO when
 * the write fails (nothing is written then).
 */
typedef struct {
    const char *run_id;
    const char *conversation_id;
    const char *user_id;
    const char *spec;
    const char *phase;
    int cycle, max_cycles;
    const char *state;
    const char *plan;
    const char *const *messages;
    size_t nmessages;
    int64_t first_position;
    const char *researcher;
    uint64_t event_seq;
    const char *event;
    int end;
    const char *report;
    const char *citations;
} loom_store_research_write;

int loom_store_research_put(loom_store *st, const loom_store_research_write *w);

/*
 * A research run as stored, for user_id (any_user: whoever's it is;
 * else another user's run, or an anonymous one for a user and the other
 * way round, is LOOM_ENOTFOUND as an unknown id). *out: {"run_id",
 * "conversation_id", "user_id", "spec", "status" ("running", "ended"),
 * "phase", "cycle", "max_cycles", "state", "plan", "report",
 * "citations", "created_at", "updated_at", "messages": [...] in order,
 * "researchers": [...] in the order they started, "last_seq"} (spec,
 * state, citations, messages and researchers parsed; null when unset)
 * and, with events, "events": [the JSON text of each, by seq]. A read
 * only.
 */
int loom_store_research_get(loom_store *st, const char *run_id,
                            const char *user_id, int any_user, int events,
                            json_t **out);

/* The ids of research runs still running (oldest first): what a server
 * resumes when it starts. *out: an array of strings. A read only. */
int loom_store_research_running(loom_store *st, json_t **out);

/*
 * Usage: sums of the stored usage rows (one per model call, of top runs
 * and sub-agents' runs alike), over a time range, narrowed to some
 * owners and grouped (docs/accounts.md#usage).
 */

/* What loom_store_usage() groups by; each at most once. */
typedef enum {
    LOOM_USAGE_BY_KEY = 1,   /* "key_id" */
    LOOM_USAGE_BY_USER,      /* "user_id" (the owner), "workspace", "user",
                                "end_user" */
    LOOM_USAGE_BY_WORKSPACE, /* "workspace" */
    LOOM_USAGE_BY_MODEL,     /* "model" */
    LOOM_USAGE_BY_AGENT      /* "agent" */
} loom_usage_group;

#define LOOM_USAGE_GROUP_KINDS 5
/* Rows one query sums at most, and groups it answers at most. */
#define LOOM_STORE_USAGE_ROWS_MAX 200000
#define LOOM_STORE_USAGE_GROUPS_MAX 10000

/* A usage query. Zero is the default for every field. */
typedef struct {
    unsigned version;
    /* Rows made in [from_ms, to_ms), Unix ms; to_ms 0: no end. */
    int64_t from_ms, to_ms;
    /* Filters, all of which a row must pass (NULL: any): its owner id
     * (loom_turn_record.user_id), and its account's key id, workspace
     * and user (loom_usage_account). */
    const char *user_id;
    const char *key_id;
    const char *workspace;
    const char *user;
    loom_usage_group group_by[LOOM_USAGE_GROUP_KINDS];
    size_t group_by_len; /* 0: one group, the total */
    /* Limits (0: LOOM_STORE_USAGE_ROWS_MAX, LOOM_STORE_USAGE_GROUPS_MAX;
     * larger values are cut to those). */
    long max_rows;
    long max_groups;
} loom_usage_query;

#define LOOM_USAGE_QUERY_VERSION 1

/*
 * Sums the usage rows q selects, exactly (integers): *out is {"data":
 * [group...], "total": {sums}}, each group the fields of its group_by
 * (loom_usage_group: null for rows without one) and the sums "calls"
 * (rows), "unpriced_calls" (rows whose cost is unknown), "prompt_tokens",
 * "completion_tokens", "cached_tokens", "reasoning_tokens",
 * "cache_write_tokens", "total_tokens" and "cost_micros" (the priced
 * rows' cost: an unpriced row adds nothing to it, and is counted in
 * unpriced_calls). Groups are ordered by their fields, nulls first.
 * LOOM_EINVALID for a bad query (to_ms before from_ms, a group twice);
 * LOOM_ETOOLARGE when the range holds more than max_rows rows or more
 * than max_groups groups (the message says which). A read only: one
 * snapshot.
 */
int loom_store_usage(loom_store *st, const loom_usage_query *q, json_t **out);

/*
 * Memories: short texts a user's runs keep across conversations (the
 * memory_store and memory_retrieve tools, loom/memory.h; docs/memory.md).
 * Every call is scoped to one user: a user id never reaches another
 * user's memories, whether by search, count or delete. A user id has 1 to
 * LOOM_STORE_USER_ID_MAX bytes; it is whatever the caller authenticated
 * (loom does not interpret it).
 */

/* Limits; crossing one is an error, never a silent cut. */
#define LOOM_STORE_USER_ID_MAX 128           /* bytes of a user id */
#define LOOM_STORE_MEMORY_MAX_BYTES 8192     /* bytes of one memory */
#define LOOM_STORE_MEMORY_MAX_PER_USER 10000 /* memories one user keeps */
#define LOOM_STORE_MEMORY_QUERY_MAX 1024     /* bytes of a search query */
#define LOOM_STORE_MEMORY_SEARCH_MAX 50      /* results of one search */

/*
 * Stores content as a memory of user_id; *id_out (caller frees) is its id
 * ("mem_" + 24 hex digits). Leading and trailing blanks are not kept.
 * Duplicates are not stored twice: when the user already has a memory
 * whose normalized text (blanks collapsed, ASCII letters lower-cased,
 * trailing '.' and '!' dropped) equals this one's, nothing new is written,
 * that memory's updated_at moves to now, *id_out is its id and
 * *duplicate_out (may be NULL) is 1; otherwise 0. Texts that differ in
 * more than that (near duplicates) are separate memories.
 * LOOM_EINVALID for a bad user id or a blank content; LOOM_ETOOLARGE for
 * content over LOOM_STORE_MEMORY_MAX_BYTES, or when the user already has
 * LOOM_STORE_MEMORY_MAX_PER_USER memories (nothing is stored then; a
 * duplicate is still recognised); LOOM_EIO when the write fails.
 */
int loom_store_memory_add(loom_store *st, const char *user_id,
                          const char *content, char **id_out,
                          int *duplicate_out);

/*
 * Finds user_id's memories matching query, best first (BM25 over the
 * words of the query, any of which may match; the words go through the
 * same tokenizer as the memories: case, diacritics and English endings do
 * not matter). query is plain text: quotes, operators and punctuation are
 * never search syntax, only word separators. A NULL query, or one with no
 * words, lists the most recently stored or confirmed memories first.
 * At most limit (1..LOOM_STORE_MEMORY_SEARCH_MAX) results. *out is
 * {"data": [{"id", "content", "created_at", "updated_at"}...]} (times
 * in Unix ms). LOOM_EINVALID for a bad user id or limit, LOOM_ETOOLARGE
 * for a query over LOOM_STORE_MEMORY_QUERY_MAX bytes.
 */
int loom_store_memory_search(loom_store *st, const char *user_id,
                             const char *query, int limit, json_t **out);

/*
 * Deletes user_id's memory id. LOOM_ENOTFOUND when the user has no memory
 * of that id (also when it is another user's: that one is left alone).
 */
int loom_store_memory_delete(loom_store *st, const char *user_id,
                             const char *id);

/* *count_out is how many memories user_id has. */
int loom_store_memory_count(loom_store *st, const char *user_id,
                            int64_t *count_out);

/*
 * Secrets at rest: what the store keeps for loom's clients (the OAuth
 * credentials of MCP servers, loom/mcp.h) is sealed (AES-256-GCM) with a
 * key derived from a secret: the one given to loom_store_set_secret(),
 * else the environment's LOOM_SECRET_KEY, else the text of a key file
 * beside the database (its path with ".key" added), made on first need
 * with 32 random bytes and mode 0600. The database alone never shows a
 * secret; a sealed row does not open with another key.
 */
#define LOOM_STORE_SECRET_ENV "LOOM_SECRET_KEY"

/*
 * Sets the secret the key is derived from (copied; NULL or "" unsets
 * it). Call before the store is shared between threads. LOOM_ENOMEM.
 */
int loom_store_set_secret(loom_store *st, const char *secret);

/*
 * The OAuth credentials of MCP server `server` for user_id (NULL: the
 * server's own, for every user): *json (caller frees) is the text last
 * saved. LOOM_ENOTFOUND when none was; LOOM_EPROTO when the row does not
 * open with the store's key (another key, or damaged: nothing is
 * given); LOOM_EINVALID when there is no key to use.
 */
int loom_store_mcp_credentials_load(loom_store *st, const char *server,
                                    const char *user_id, char **json);
/* Seals json and keeps it, replacing what server and user_id had. */
int loom_store_mcp_credentials_save(loom_store *st, const char *server,
                                    const char *user_id, const char *json);
/* Forgets what server and user_id had; LOOM_ENOTFOUND when nothing. */
int loom_store_mcp_credentials_delete(loom_store *st, const char *server,
                                      const char *user_id);

/*
 * The settings of user_id (an owner id; NULL or "": the anonymous user),
 * sealed as the credentials above (they hold the user's own keys):
 * *json (caller frees) is the text last saved. LOOM_ENOTFOUND when none
 * was; LOOM_EPROTO when it does not open with the store's key;
 * LOOM_EINVALID when there is no key to use. What the text means is
 * loom/accounts.h's (loom_user_settings_*).
 */
int loom_store_user_settings_load(loom_store *st, const char *user_id,
                                  char **json);
/* Seals json and keeps it as user_id's settings, replacing any. */
int loom_store_user_settings_save(loom_store *st, const char *user_id,
                                  const char *json);

#ifdef __cplusplus
}
#endif
#endif
