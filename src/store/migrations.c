/*
 * The SQLite schema, as an ordered list of migrations.
 *
 * Migration N (1-based) takes a database from schema version N - 1 to N;
 * the version lives in the file header (PRAGMA user_version) and each step
 * runs in its own transaction together with the version bump, so a crash
 * mid-migration leaves the previous version intact. Steps are never edited
 * once released: a change to the schema is a new step at the end. See
 * docs/store.md for what each column means.
 */
#include "store/sqlite_internal.h"

const char *const loom__sqlite_migrations[] = {
    /* 1: conversations, messages, tool calls, tool outputs, usage. */
    "CREATE TABLE conversations ("
    "  id TEXT PRIMARY KEY,"
    "  title TEXT NOT NULL DEFAULT '',"
    "  agent TEXT,"
    "  model TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  message_count INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE messages ("
    "  id TEXT PRIMARY KEY,"
    "  conversation_id TEXT NOT NULL"
    "    REFERENCES conversations(id) ON DELETE CASCADE,"
    "  position INTEGER NOT NULL,"
    "  run_id TEXT,"
    "  role TEXT NOT NULL"
    "    CHECK (role IN ('system', 'user', 'assistant', 'tool')),"
    "  content TEXT,"
    "  reasoning TEXT,"
    "  model TEXT,"
    "  finish_reason TEXT,"
    "  status TEXT NOT NULL DEFAULT 'ok'"
    "    CHECK (status IN ('ok', 'error', 'cancelled')),"
    "  error TEXT,"
    "  prompt_tokens INTEGER,"
    "  completion_tokens INTEGER,"
    "  cost REAL,"
    "  tool_call_id TEXT,"
    "  name TEXT,"
    "  placeholder INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL,"
    "  UNIQUE (conversation_id, position)"
    ");"
    "CREATE TABLE tool_calls ("
    "  message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,"
    "  position INTEGER NOT NULL,"
    "  call_id TEXT NOT NULL,"
    "  name TEXT NOT NULL,"
    "  arguments TEXT NOT NULL,"
    "  text_offset INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (message_id, position)"
    ") WITHOUT ROWID;"
    "CREATE TABLE tool_outputs ("
    "  message_id TEXT PRIMARY KEY"
    "    REFERENCES messages(id) ON DELETE CASCADE,"
    "  call_id TEXT NOT NULL,"
    "  status TEXT CHECK (status IN ('success', 'error')),"
    "  duration_ms REAL"
    ") WITHOUT ROWID;"
    "CREATE TABLE usage ("
    "  id INTEGER PRIMARY KEY,"
    "  conversation_id TEXT NOT NULL"
    "    REFERENCES conversations(id) ON DELETE CASCADE,"
    "  run_id TEXT,"
    "  model TEXT,"
    "  iteration INTEGER NOT NULL,"
    "  prompt_tokens INTEGER NOT NULL,"
    "  completion_tokens INTEGER NOT NULL,"
    "  cached_tokens INTEGER NOT NULL,"
    "  reasoning_tokens INTEGER NOT NULL,"
    "  total_tokens INTEGER NOT NULL,"
    "  cost REAL,"
    "  created_at INTEGER NOT NULL"
    ");",

    /* 2: indexes for listing conversations and reading or deleting a
     * conversation's usage. */
    "CREATE INDEX conversations_by_update"
    "  ON conversations (updated_at, id);"
    "CREATE INDEX usage_by_conversation ON usage (conversation_id, id);",

    /* 3: provider state on messages (what an adapter needs back on the
     * next turn: Anthropic thinking signatures, Gemini thoughtSignature,
     * the Responses API response id), exact costs in micro-dollars, and
     * cache-write tokens. Costs already stored are carried over. */
    "ALTER TABLE messages ADD COLUMN provider_state TEXT;"
    "ALTER TABLE messages ADD COLUMN cost_micros INTEGER;"
    "ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER NOT NULL"
    "  DEFAULT 0;"
    "ALTER TABLE usage ADD COLUMN cost_micros INTEGER;"
    "UPDATE messages SET cost_micros = CAST(round(cost * 1000000) AS INTEGER)"
    "  WHERE cost IS NOT NULL;"
    "UPDATE usage SET cost_micros = CAST(round(cost * 1000000) AS INTEGER)"
    "  WHERE cost IS NOT NULL;",

    /* 4: users' memories and their full-text index. seq is an INTEGER
     * PRIMARY KEY so the index's rowids stay stable (VACUUM may renumber
     * an implicit rowid); norm is the normalized text that makes a
     * duplicate. The FTS5 table holds no copy of the text (external
     * content) and triggers keep it in step with every insert, delete and
     * update, in the same transaction. */
    "CREATE TABLE memories ("
    "  seq INTEGER PRIMARY KEY,"
    "  id TEXT NOT NULL UNIQUE,"
    "  user_id TEXT NOT NULL,"
    "  content TEXT NOT NULL,"
    "  norm TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  UNIQUE (user_id, norm)"
    ");"
    "CREATE INDEX memories_by_user ON memories (user_id, updated_at, seq);"
    "CREATE VIRTUAL TABLE memories_fts USING fts5(content,"
    "  content = 'memories', content_rowid = 'seq',"
    "  tokenize = 'porter unicode61 remove_diacritics 2');"
    "CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN"
    "  INSERT INTO memories_fts (rowid, content)"
    "    VALUES (new.seq, new.content);"
    "END;"
    "CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN"
    "  INSERT INTO memories_fts (memories_fts, rowid, content)"
    "    VALUES ('delete', old.seq, old.content);"
    "END;"
    "CREATE TRIGGER memories_fts_update AFTER UPDATE OF content ON memories"
    "  BEGIN"
    "  INSERT INTO memories_fts (memories_fts, rowid, content)"
    "    VALUES ('delete', old.seq, old.content);"
    "  INSERT INTO memories_fts (rowid, content)"
    "    VALUES (new.seq, new.content);"
    "END;",

    /* 5: what a turn leaves besides its messages: the context engine's
     * summary of older messages (with how many messages it replaces),
     * the sources an answer cites (a JSON array on the answer), and one
     * row per tool call record (tool.metric data as JSON, with the fields
     * one filters on in columns). */
    "ALTER TABLE conversations ADD COLUMN summary TEXT;"
    "ALTER TABLE conversations ADD COLUMN summary_covers INTEGER NOT NULL"
    "  DEFAULT 0;"
    "ALTER TABLE messages ADD COLUMN citations TEXT;"
    "CREATE TABLE tool_records ("
    "  id INTEGER PRIMARY KEY,"
    "  conversation_id TEXT NOT NULL"
    "    REFERENCES conversations(id) ON DELETE CASCADE,"
    "  run_id TEXT,"
    "  position INTEGER NOT NULL,"
    "  tool TEXT,"
    "  call_id TEXT,"
    "  status TEXT,"
    "  duration_ms REAL,"
    "  record TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX tool_records_by_conversation"
    "  ON tool_records (conversation_id, id);",

    /* 6: the run's plan (todo_write) kept with the conversation. */
    "ALTER TABLE conversations ADD COLUMN plan TEXT;",

    /* 7: images and files of messages. A message's parts (JSON: text,
     * and images and files by URL or by the SHA-256 of their bytes) go in
     * messages.parts; the bytes go once in blobs, however many messages
     * hold them. message_blobs says which message holds which blob; when
     * the last holder of a blob goes (a conversation deleted, cascading
     * to its messages), the trigger deletes the blob in the same
     * statement. Independent of every other step: it adds only its own
     * tables and column. */
    "ALTER TABLE messages ADD COLUMN parts TEXT;"
    "CREATE TABLE blobs ("
    "  hash TEXT PRIMARY KEY,"
    "  mime TEXT,"
    "  bytes INTEGER NOT NULL,"
    "  data BLOB NOT NULL"
    ") WITHOUT ROWID;"
    "CREATE TABLE message_blobs ("
    "  message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,"
    "  hash TEXT NOT NULL REFERENCES blobs(hash),"
    "  PRIMARY KEY (message_id, hash)"
    ") WITHOUT ROWID;"
    "CREATE INDEX message_blobs_by_hash ON message_blobs (hash);"
    "CREATE TRIGGER message_blobs_release AFTER DELETE ON message_blobs"
    "  BEGIN"
    "  DELETE FROM blobs WHERE hash = old.hash AND NOT EXISTS"
    "    (SELECT 1 FROM message_blobs WHERE hash = old.hash);"
    "END;",
    /* 8: whose a conversation is (NULL: anonymous) and the hashes of its
     * client-visible form (store/transcript.h), set by its first turn, by
     * which a client that resends its whole history is found continuing
     * it; conversations with messages from before have none and are never
     * found. Independent of every other step: it adds only its own
     * columns and indexes. */
    "ALTER TABLE conversations ADD COLUMN user_id TEXT;"
    "ALTER TABLE conversations ADD COLUMN prefix_hash BLOB;"
    "ALTER TABLE conversations ADD COLUMN prefix_hash_streamed BLOB;"
    "CREATE INDEX conversations_by_prefix"
    "  ON conversations (user_id, prefix_hash);"
    "CREATE INDEX conversations_by_prefix_streamed"
    "  ON conversations (user_id, prefix_hash_streamed);",
    /* 9: which agent wrote each assistant message (a handoff changes the
     * agent within a turn); NULL for messages from before, whose writer
     * is not known. Independent of every other step: it adds only its
     * own column. */
    "ALTER TABLE messages ADD COLUMN agent TEXT;",
    /* 10: one row per run, top-level or sub-agent: where it sits in its
     * tree of agent runs (parent_run_id NULL at the top), its outcome
     * and its usage, descendants included; the messages of a sub-agent's
     * run (never in a conversation's messages) in run_messages; and the
     * agent of each usage row. A run's conversation is its top-level
     * run's, so deleting the conversation deletes the tree. Independent
     * of every other step: it adds only its own tables and column. */
    "CREATE TABLE runs ("
    "  id TEXT PRIMARY KEY,"
    "  conversation_id TEXT NOT NULL"
    "    REFERENCES conversations(id) ON DELETE CASCADE,"
    "  parent_run_id TEXT,"
    "  parent_call_id TEXT,"
    "  depth INTEGER NOT NULL DEFAULT 0,"
    "  user_id TEXT,"
    "  agent TEXT,"
    "  model TEXT,"
    "  status TEXT NOT NULL"
    "    CHECK (status IN ('completed', 'failed', 'cancelled')),"
    "  error TEXT,"
    "  finish_reason TEXT,"
    "  prompt_tokens INTEGER NOT NULL,"
    "  completion_tokens INTEGER NOT NULL,"
    "  cached_tokens INTEGER NOT NULL,"
    "  reasoning_tokens INTEGER NOT NULL,"
    "  total_tokens INTEGER NOT NULL,"
    "  cache_write_tokens INTEGER NOT NULL,"
    "  cost_micros INTEGER,"
    "  created_at INTEGER NOT NULL,"
    "  ended_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX runs_by_parent ON runs (parent_run_id, created_at, id);"
    "CREATE INDEX runs_by_conversation ON runs (conversation_id);"
    "CREATE TABLE run_messages ("
    "  run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  position INTEGER NOT NULL,"
    "  role TEXT NOT NULL"
    "    CHECK (role IN ('system', 'user', 'assistant', 'tool')),"
    "  content TEXT,"
    "  reasoning TEXT,"
    "  agent TEXT,"
    "  tool_calls TEXT,"
    "  tool_call_id TEXT,"
    "  name TEXT,"
    "  tool_status TEXT,"
    "  duration_ms REAL,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY (run_id, position)"
    ") WITHOUT ROWID;"
    "ALTER TABLE usage ADD COLUMN agent TEXT;",
    /* 11: accounts (loom/accounts.h, docs/accounts.md). Workspaces hold
     * users; a user holds API keys, of which only the id and an HMAC of
     * the secret are kept (the pepper is in auth_secrets). The limit
     * columns of workspaces, users and keys are NULL for none. The audit
     * log records who created or revoked a key, or changed limits. A
     * conversation's owner (user_id, from step 8) is now also set when
     * it is created; conversations_by_owner lists one owner's. Independent
     * of every other step: it adds only its own tables and index. */
    "CREATE TABLE workspaces ("
    "  id TEXT PRIMARY KEY,"
    "  created_at INTEGER NOT NULL,"
    "  rpm INTEGER, tpm INTEGER, max_concurrent INTEGER,"
    "  budget_micros INTEGER, budget_period TEXT"
    ");"
    "CREATE TABLE users ("
    "  workspace TEXT NOT NULL REFERENCES workspaces(id),"
    "  name TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  rpm INTEGER, tpm INTEGER, max_concurrent INTEGER,"
    "  budget_micros INTEGER, budget_period TEXT,"
    "  PRIMARY KEY (workspace, name)"
    ") WITHOUT ROWID;"
    "CREATE TABLE api_keys ("
    "  id TEXT PRIMARY KEY,"
    "  hash BLOB NOT NULL,"
    "  workspace TEXT NOT NULL,"
    "  user_name TEXT NOT NULL,"
    "  service INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER,"
    "  revoked_at INTEGER,"
    "  models TEXT, agents TEXT,"
    "  rpm INTEGER, tpm INTEGER, max_concurrent INTEGER,"
    "  budget_micros INTEGER, budget_period TEXT,"
    "  FOREIGN KEY (workspace, user_name) REFERENCES users(workspace, name)"
    ");"
    "CREATE INDEX api_keys_by_user ON api_keys (workspace, user_name);"
    "CREATE TABLE audit_log ("
    "  id INTEGER PRIMARY KEY,"
    "  at INTEGER NOT NULL,"
    "  actor TEXT NOT NULL,"
    "  action TEXT NOT NULL,"
    "  key_id TEXT, workspace TEXT, user_name TEXT,"
    "  detail TEXT"
    ");"
    "CREATE TABLE auth_secrets ("
    "  name TEXT PRIMARY KEY,"
    "  value BLOB NOT NULL"
    ") WITHOUT ROWID;"
    "CREATE INDEX conversations_by_owner"
    "  ON conversations (user_id, updated_at, id);",
    /* 12: the OAuth credentials of MCP servers (registered clients and
     * tokens, per authorization server), one row per server and user
     * ('' when none), sealed with the store's secret key (secrets.c):
     * the database alone never shows a token. Independent of every
     * other step: it adds only its own table. */
    "CREATE TABLE mcp_credentials ("
    "  server TEXT NOT NULL,"
    "  user_id TEXT NOT NULL DEFAULT '',"
    "  sealed BLOB NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  PRIMARY KEY (server, user_id)"
    ") WITHOUT ROWID;",
    /* 13: budgets (loom/limits.h): what each scope (a key, a user, a
     * workspace) spent in each budget period, in micro-dollars, and
     * whether a budget lets calls to models without prices through.
     * Independent of every other step: it adds only its own table and
     * columns. */
    "CREATE TABLE budget_spend ("
    "  scope TEXT NOT NULL,"
    "  period TEXT NOT NULL,"
    "  period_start INTEGER NOT NULL,"
    "  spent_micros INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  PRIMARY KEY (scope, period, period_start)"
    ") WITHOUT ROWID;"
    "ALTER TABLE api_keys ADD COLUMN budget_unpriced INTEGER NOT NULL"
    "  DEFAULT 0;"
    "ALTER TABLE users ADD COLUMN budget_unpriced INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE workspaces ADD COLUMN budget_unpriced INTEGER NOT NULL"
    "  DEFAULT 0;",
    /* 14: research runs (docs/store.md#research-runs), kept as they go
     * so that one interrupted by a stop resumes when loom starts again:
     * the request that started it (spec), where it is (phase, cycle) and
     * the state to resume from, its plan, report and citations; the
     * supervisor's messages, appended after each step; one row per
     * researcher, written when it starts and when it ends (its result,
     * citations, documents and usage); every event of its stream, by
     * seq. Owned by the run's user; deleting the conversation deletes
     * them. Independent of every other step: it adds only its own
     * tables. */
    "CREATE TABLE research_runs ("
    "  run_id TEXT PRIMARY KEY,"
    "  conversation_id TEXT NOT NULL"
    "    REFERENCES conversations(id) ON DELETE CASCADE,"
    "  user_id TEXT,"
    "  spec TEXT NOT NULL,"
    "  status TEXT NOT NULL CHECK (status IN ('running', 'ended')),"
    "  phase TEXT,"
    "  cycle INTEGER NOT NULL DEFAULT 0,"
    "  max_cycles INTEGER NOT NULL DEFAULT 0,"
    "  state TEXT,"
    "  plan TEXT,"
    "  report TEXT,"
    "  citations TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX research_runs_by_status ON research_runs (status);"
    "CREATE TABLE research_messages ("
    "  run_id TEXT NOT NULL"
    "    REFERENCES research_runs(run_id) ON DELETE CASCADE,"
    "  position INTEGER NOT NULL,"
    "  message TEXT NOT NULL,"
    "  PRIMARY KEY (run_id, position)"
    ") WITHOUT ROWID;"
    "CREATE TABLE research_researchers ("
    "  run_id TEXT NOT NULL"
    "    REFERENCES research_runs(run_id) ON DELETE CASCADE,"
    "  call_id TEXT NOT NULL,"
    "  task TEXT,"
    "  status TEXT NOT NULL"
    "    CHECK (status IN ('running', 'completed', 'failed')),"
    "  data TEXT,"
    "  started_at INTEGER NOT NULL,"
    "  ended_at INTEGER,"
    "  PRIMARY KEY (run_id, call_id)"
    ") WITHOUT ROWID;"
    "CREATE TABLE research_events ("
    "  run_id TEXT NOT NULL"
    "    REFERENCES research_runs(run_id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  event TEXT NOT NULL,"
    "  PRIMARY KEY (run_id, seq)"
    ") WITHOUT ROWID;",
    /* 15: users' own settings (docs/accounts.md "Per-user settings"),
     * one row per owner id ('' for the anonymous user of mode none),
     * sealed whole with the store's secret key (secrets.c), since they
     * hold the users' keys. Independent of every other step: it adds
     * only its own table. */
    "CREATE TABLE user_settings ("
    "  user_id TEXT PRIMARY KEY,"
    "  sealed BLOB NOT NULL,"
    "  updated_at INTEGER NOT NULL"
    ") WITHOUT ROWID;",
    /* 16: whom each usage row is counted to, for GET /v1/usage: its
     * owner (user_id, as the conversation's and the run's) and its
     * account (loom_usage_account: the API key, its workspace and user,
     * a service key's end user; NULL for none). Rows from before get the
     * owner of their conversation (a sub-agent run's rows are in its top
     * run's) and, when that owner reads workspace/user[/end_user], its
     * parts; a plain owner (no '/', made without a key) is its own user;
     * their key is not known. An index for each way rows are selected
     * (by time, owner, account, user, key), so that a query reads the
     * rows it sums and no others. Independent of every other step: it
     * adds only its own columns and indexes. */
    "ALTER TABLE usage ADD COLUMN user_id TEXT;"
    "ALTER TABLE usage ADD COLUMN key_id TEXT;"
    "ALTER TABLE usage ADD COLUMN workspace TEXT;"
    "ALTER TABLE usage ADD COLUMN user_name TEXT;"
    "ALTER TABLE usage ADD COLUMN end_user TEXT;"
    "UPDATE usage SET user_id = (SELECT c.user_id FROM conversations c"
    "  WHERE c.id = usage.conversation_id);"
    "UPDATE usage SET user_name = user_id"
    "  WHERE instr(user_id, '/') = 0 AND substr(user_id, 1, 1) <> '~';"
    "UPDATE usage SET workspace = substr(user_id, 1, instr(user_id, '/') - 1),"
    "  user_name = substr(user_id, instr(user_id, '/') + 1)"
    "  WHERE instr(user_id, '/') > 0;"
    "UPDATE usage SET end_user = substr(user_name, instr(user_name, '/') + 1),"
    "  user_name = substr(user_name, 1, instr(user_name, '/') - 1)"
    "  WHERE instr(user_name, '/') > 0;"
    "CREATE INDEX usage_by_time ON usage (created_at);"
    "CREATE INDEX usage_by_owner ON usage (user_id, created_at);"
    "CREATE INDEX usage_by_account ON usage (workspace, user_name, "
    "created_at);"
    "CREATE INDEX usage_by_user ON usage (user_name, created_at);"
    "CREATE INDEX usage_by_key ON usage (key_id, created_at);",
    /* 17: branches (docs/store.md#branches). A branch is a conversation
     * made from another (parent_id) by copying its messages before one of
     * its user messages (fork_message, at fork_position), to go on with
     * another version of that message; deleting a conversation deletes
     * its branches (the foreign key cascades). A message's version group
     * (version_of) says which original message it is a copy of, or the
     * first message of a branch an edit of: fork_origin, the group of the
     * message it replaces. NULL everywhere for conversations from before,
     * which have no branches. Independent of every other step: it adds
     * only its own columns and indexes. */
    "ALTER TABLE conversations ADD COLUMN parent_id TEXT"
    "  REFERENCES conversations(id) ON DELETE CASCADE;"
    "ALTER TABLE conversations ADD COLUMN fork_position INTEGER;"
    "ALTER TABLE conversations ADD COLUMN fork_message TEXT;"
    "ALTER TABLE conversations ADD COLUMN fork_origin TEXT;"
    "ALTER TABLE messages ADD COLUMN version_of TEXT;"
    "CREATE INDEX conversations_by_parent ON conversations (parent_id);"
    "CREATE INDEX conversations_by_origin ON conversations (fork_origin);",
    /* 18: the indexes on columns that are often NULL hold only the rows
     * that have a value: no lookup ever asks for NULL through them (each
     * compares with '=', which SQLite knows implies IS NOT NULL), and a
     * row without one (an anonymous caller's, a top-level run's, a
     * conversation before its first turn) then writes fewer index pages.
     * Same names, same columns. */
    "DROP INDEX conversations_by_prefix;"
    "CREATE INDEX conversations_by_prefix ON conversations (user_id, "
    "prefix_hash) WHERE prefix_hash IS NOT NULL;"
    "DROP INDEX conversations_by_prefix_streamed;"
    "CREATE INDEX conversations_by_prefix_streamed ON conversations "
    "(user_id, prefix_hash_streamed) WHERE prefix_hash_streamed IS NOT NULL;"
    "DROP INDEX conversations_by_owner;"
    "CREATE INDEX conversations_by_owner ON conversations (user_id, "
    "updated_at, id) WHERE user_id IS NOT NULL;"
    "DROP INDEX conversations_by_parent;"
    "CREATE INDEX conversations_by_parent ON conversations (parent_id) "
    "WHERE parent_id IS NOT NULL;"
    "DROP INDEX conversations_by_origin;"
    "CREATE INDEX conversations_by_origin ON conversations (fork_origin) "
    "WHERE fork_origin IS NOT NULL;"
    "DROP INDEX runs_by_parent;"
    "CREATE INDEX runs_by_parent ON runs (parent_run_id, created_at, id) "
    "WHERE parent_run_id IS NOT NULL;"
    "DROP INDEX usage_by_owner;"
    "CREATE INDEX usage_by_owner ON usage (user_id, created_at) "
    "WHERE user_id IS NOT NULL;"
    "DROP INDEX usage_by_account;"
    "CREATE INDEX usage_by_account ON usage (workspace, user_name, "
    "created_at) WHERE workspace IS NOT NULL;"
    "DROP INDEX usage_by_user;"
    "CREATE INDEX usage_by_user ON usage (user_name, created_at) "
    "WHERE user_name IS NOT NULL;"
    "DROP INDEX usage_by_key;"
    "CREATE INDEX usage_by_key ON usage (key_id, created_at) "
    "WHERE key_id IS NOT NULL;",
    /* 19: the CHECK constraints that list more than two values say the
     * same with '=' and OR. SQLite builds a list of three or more as an
     * ephemeral table at every statement that checks it: a B-tree
     * created and dropped per message (two lists), run and researcher
     * row written. With '=' the check is a few comparisons. The
     * constraints accept exactly the same values (every such column is
     * TEXT, compared as BINARY), so no row needs checking again, and
     * the tables are edited in place as SQLite documents for a CHECK
     * change (sqlite.org/lang_altertable.html, "making other kinds of
     * table schema changes"): the schema text is replaced inside this
     * step's transaction, this connection reads it again (RESET) and
     * migrate() bumps the schema cookie so that other connections do
     * too. */
    "PRAGMA writable_schema = ON;"
    "UPDATE sqlite_schema SET sql = replace(replace(replace(replace(sql,"
    "  'role IN (''system'', ''user'', ''assistant'', ''tool'')',"
    "  'role = ''system'' OR role = ''user'' OR role = ''assistant'' OR "
    "role = ''tool'''),"
    "  'status IN (''ok'', ''error'', ''cancelled'')',"
    "  'status = ''ok'' OR status = ''error'' OR status = ''cancelled'''),"
    "  'status IN (''completed'', ''failed'', ''cancelled'')',"
    "  'status = ''completed'' OR status = ''failed'' OR "
    "status = ''cancelled'''),"
    "  'status IN (''running'', ''completed'', ''failed'')',"
    "  'status = ''running'' OR status = ''completed'' OR "
    "status = ''failed''')"
    "  WHERE type = 'table' AND name IN ('messages', 'runs', "
    "'run_messages', 'research_researchers');"
    "PRAGMA writable_schema = RESET;",
    /* 20: a conversation's streamed transcript hash is kept only where it
     * differs from the other (the model spoke before loom's tools ran);
     * NULL beside a prefix_hash now reads as the same hash, so a turn
     * writes one index entry fewer (conversations_by_prefix_streamed is
     * partial). The rows that have both the same drop the copy. A loom
     * from before this step would read such a NULL as "no hash": the
     * version keeps it from opening the store. */
    "UPDATE conversations SET prefix_hash_streamed = NULL"
    "  WHERE prefix_hash_streamed = prefix_hash;",
};

const int loom__sqlite_migrations_len =
    (int)(sizeof(loom__sqlite_migrations) / sizeof(loom__sqlite_migrations[0]));
