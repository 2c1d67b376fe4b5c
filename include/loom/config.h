/*
 * loom/config.h: loom's configuration, from one YAML file and the
 * environment.
 *
 * A config is immutable once built and owned by whoever loaded it; a reload
 * builds a new one. Strings in the file may use ${ENV_VAR} (and
 * ${ENV_VAR:-default}), replaced when the file is read. Every error names
 * the file, the line and the key ("loom.yaml:12: agents.helper.model: ..."),
 * and a load reports every error of the file, one per line, up to
 * LOOM_CONFIG_MAX_ERRORS.
 *
 * Without a file (loom_config_from_env), providers come from the
 * environment: `openai` (Chat Completions) and `openai-responses` when
 * OPENAI_API_KEY or OPENAI_BASE_URL is set (default base URL
 * https://api.openai.com/v1), `anthropic` from ANTHROPIC_API_KEY /
 * ANTHROPIC_BASE_URL (default https://api.anthropic.com) and `gemini`
 * from GEMINI_API_KEY / GEMINI_BASE_URL (default
 * https://generativelanguage.googleapis.com). A file adds providers,
 * models and agents, and overrides those of the environment by name.
 *
 * Models are referred to as "provider/model" ("openai/gpt-4o-mini"). A
 * model that is not listed under `models` still resolves when its provider
 * exists: the part after the first '/' is sent as the upstream id.
 *
 * The file's shape (see loom.example.yaml):
 *
 *   log: {level: info, format: text}
 *   providers:
 *     openai:
 *       kind: openai            # openai | openai-responses | anthropic |
 *                               # gemini (the wire format)
 *       base_url: https://api.openai.com/v1
 *       api_key: ${OPENAI_API_KEY}
 *       headers: {X-Extra: v}   # optional extra request headers
 *       timeouts: {connect_ms: 10000, first_byte_ms: 60000, idle_ms: 60000}
 *       retries: {max: 2, base_delay_ms: 500, max_delay_ms: 8000}
 *   models:
 *     openai/gpt-4o-mini:
 *       upstream: gpt-4o-mini   # id sent upstream (default: after '/')
 *       context_window: 128000
 *       max_output_tokens: 16384
 *       context_window_fallback: openai/gpt-4.1   # larger window
 *       capabilities: {tools: true, parallel_tool_calls: true,
 *                      reasoning: false, vision: false}
 *       reasoning: {effort: medium, thinking_budget: 8000}
 *       prompt_cache: false
 *       chain_responses: false
 *       prices: {input: 0.15, cached_input: 0.075, output: 0.60}
 *       fallbacks: [backup/gpt-4o-mini]
 *       routing: {retries: 0, cooldown_ms: 30000,
 *                 failures_before_cooldown: 3}
 *   routing: {...}              # the default policy of every model
 *   agents:
 *     helper:
 *       model: openai/gpt-4o-mini
 *       system_prompt: You are helpful.
 *       tools: [get_time]
 *       max_iterations: 10
 *       tool_choice: auto       # auto | none | required | <tool name>
 *       parallel_tool_calls: true
 *       tool_concurrency: 8
 *       planning: false         # offer todo_write, show the plan
 *       think: false            # offer think (free thinking turns)
 *       tool_timeout_ms: 300000 # a tool call's default timeout
 *   default_agent: helper
 *   tools:
 *     get_time: {default_timezone: UTC}   # free-form settings per tool
 *   http_tools:                 # HTTP APIs offered as tools (see below)
 *   mcp_servers:                # MCP servers whose tools are offered
 *     create_ticket: {description: ..., url: ..., method: POST}
 *   server: {listen: 127.0.0.1:8080, db: ./data/loom.db}  # see below
 */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include "common.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *name;     /* key under `providers` */
    char *kind;     /* wire format: openai, openai-responses, anthropic,
                     * gemini */
    char *base_url; /* no trailing slash */
    char *api_key;  /* may be NULL (local servers need none) */
    json_t *headers; /* object of extra headers, never NULL */
    long connect_timeout_ms;    /* default 10000 */
    long first_byte_timeout_ms; /* default 120000 */
    long idle_timeout_ms;       /* default 120000 */
    long answer_timeout_ms;     /* default 600000: until the first byte of
                                 * a whole (not streamed) answer; 0: as
                                 * first_byte_timeout_ms */
    int max_retries;            /* default 2 */
    long retry_base_delay_ms;   /* default 500 */
    long retry_max_delay_ms;    /* default 30000 */
} loom_provider_config;

/* What a model supports; requests leave out what it does not. */
typedef struct {
    int tools;               /* function calling; default 1 */
    int parallel_tool_calls; /* the parallel_tool_calls flag; default 1 */
    int reasoning;           /* reasoning controls; default 0 */
    int vision;              /* image input; default 0 */
    /* An OpenAI-compatible provider takes the output limit as
     * max_completion_tokens (1) or max_tokens (0); default -1: by the
     * model's family (loom_config_known_max_completion_tokens). */
    int max_completion_tokens;
} loom_model_capabilities;

/*
 * A model's prices in micro-dollars (1e-6 USD) per million tokens, read
 * exactly from the decimal text of dollars per million tokens ("0.15" is
 * 150000). Unset optional prices are -1: cached input and cache writes
 * are then billed at `input`, reasoning at `output`.
 */
typedef struct {
    int set;              /* prices were given; else cost is unknown */
    int64_t input;
    int64_t cached_input; /* -1: input */
    int64_t cache_write;  /* -1: input */
    int64_t output;
    int64_t reasoning;    /* -1: output */
} loom_model_prices;

/* The most a price may be: $1,000,000 per million tokens. */
#define LOOM_PRICE_MAX_MICROS ((int64_t)1000000 * 1000000)
/* The most fallbacks one model may list. */
#define LOOM_MODEL_MAX_FALLBACKS 8

/* How the router treats a model's failures (see docs/routing.md). */
typedef struct {
    int retries;           /* extra tries of the model before the next
                            * fallback, on top of the provider's own
                            * retries; default 0 */
    long cooldown_ms;      /* how long a failing model is skipped;
                            * default 30000; 0: never skipped */
    int failures_before_cooldown; /* failures in a row; default 3 */
} loom_routing_policy;

typedef struct {
    char *name;        /* "provider/model" */
    char *provider;    /* provider name */
    char *upstream;    /* model id sent upstream */
    long context_window;    /* tokens, 0 when unknown */
    long max_output_tokens; /* tokens, 0 when unknown */
    loom_model_capabilities capabilities;
    /* Reasoning controls, only ever set with capabilities.reasoning:
     * "minimal", "low", "medium" or "high", or NULL; a thinking budget in
     * tokens, or 0. */
    char *reasoning_effort;
    long thinking_budget;
    int prompt_cache;    /* place prompt-cache breakpoints; default 0 */
    int chain_responses; /* Responses API chaining; default 0 */
    loom_model_prices prices;
    char **fallbacks;    /* "provider/model" names tried in order */
    size_t fallbacks_len;
    loom_routing_policy routing; /* the config's `routing` unless set */
    /* The model a run moves to when a request cannot fit this model's
     * window even after trimming (docs/context.md), or NULL. */
    char *context_window_fallback;
} loom_model_config;

typedef enum {
    LOOM_TOOL_CHOICE_AUTO = 0,
    LOOM_TOOL_CHOICE_NONE,
    LOOM_TOOL_CHOICE_REQUIRED,
    LOOM_TOOL_CHOICE_FUNCTION
} loom_tool_choice_kind;

typedef struct {
    loom_tool_choice_kind kind;
    char *function; /* the tool's name, for LOOM_TOOL_CHOICE_FUNCTION */
} loom_tool_choice;

/*
 * What the store keeps of an agent's turns, `data_policy:` (docs/config.md;
 * the recorder's loom_data_policy says what each switch removes). Zero
 * stores everything.
 */
typedef struct {
    int omit_text;         /* store_text: false */
    int omit_tool_calls;   /* store_tool_calls: false */
    int omit_tool_results; /* store_tool_results: false */
    char **tools;          /* `tools`: only these tools are stored */
    size_t tools_len;
    int tools_set; /* `tools` was given (an empty list: none) */
} loom_agent_data_policy;

/*
 * `many_results_prompt: {after, prompt}`: after a turn with more than
 * `after` tool results, a system note asks the model to keep its context
 * summary short. after 0: off (the key absent); the key given: after
 * defaults to 2 and prompt (NULL) to the built-in note.
 */
typedef struct {
    int after;
    char *prompt;
} loom_agent_many_results;

/*
 * One tool's entry in an agent's tool-description registry, the YAML file
 * its `tool_descriptions:` key names (docs/agents.md "System prompt"):
 * keyed by the tool's name, for the tools the agent offers (others are
 * ignored).
 */
typedef struct {
    char *name;           /* the tool */
    char *description;    /* replaces the tool's description; NULL: keep */
    char *selection_rule; /* its usage rule in the system prompt; NULL:
                           * the tool settings' selection_rule */
} loom_agent_tool_doc;

/* One example exchange of a few-shot file. */
typedef struct {
    char *user;
    char *assistant;
} loom_agent_example;

/*
 * `few_shot: {file, models}`: example exchanges sent after the system
 * prompt to the models listed (none listed: every model); never stored.
 */
typedef struct {
    char *file;    /* as written in the config */
    char **models; /* "provider/model" names; NULL: every model */
    size_t models_len;
    loom_agent_example *examples; /* in file order */
    size_t examples_len;
} loom_agent_few_shot;

/* Bytes of a file an agent key names (tool_descriptions, few_shot). */
#define LOOM_AGENT_FILE_MAX ((size_t)256 << 10)
/* Exchanges of one few-shot file. */
#define LOOM_AGENT_EXAMPLES_MAX 50
/*
 * `retry_without_tool_calls: {max, prompt}` (seed 000's deep research
 * retry): a model call that asks for no tool while tools are offered is
 * followed by another, with prompt as a system note, at most max times.
 * max 0: off (the key absent); the key given: max defaults to 1 and
 * prompt (NULL) to the built-in note.
 */
typedef struct {
    int max;
    char *prompt;
} loom_agent_retry;

/*
 * `model_after_retries: {retries, model}`: once the run made `retries`
 * such retries, its later model calls use `model` (a cheaper one).
 * model NULL: off; retries defaults to 1.
 */
typedef struct {
    int retries;
    char *model; /* "provider/model" */
} loom_agent_model_after;

typedef struct {
    char *name;
    char *model;         /* "provider/model" */
    char *system_prompt; /* may be NULL */
    char **tools;        /* tool names; NULL with tools_all set */
    size_t tools_len;
    size_t *tools_lines; /* the file's line of each of tools, for messages;
                          * NULL when not read from YAML */
    int tools_all;       /* no `tools` key: every registered tool */
    int max_iterations;  /* default 10 */
    loom_tool_choice tool_choice;
    int parallel_tool_calls; /* default 1 */
    int tool_concurrency;    /* default 8 */
    int planning;            /* offer todo_write; default 0 */
    int think;               /* offer think; default 0 */
    long tool_timeout_ms;    /* 0: the run's default */
    long approval_timeout_ms; /* a call's wait for approval; 0: the run's
                               * default (10 min) */
    int review;              /* review each tool turn; default 0 */
    char *review_model;      /* "provider/model" of the reviewer; NULL:
                              * the agent's model */
    int citations;           /* number tool documents, check [n]; 0 */
    int memory;              /* offer the memory tools; default 1 */
    loom_agent_data_policy data_policy; /* default: store everything */
    char *limit_prompt; /* the note before the last permitted call; NULL:
                         * the built-in one */
    loom_agent_many_results many_results; /* many_results_prompt */
    char *tool_descriptions;              /* the registry file as written */
    loom_agent_tool_doc *tool_docs;       /* its entries, in file order */
    size_t tool_docs_len;
    loom_agent_few_shot few_shot; /* no examples: none */
    /* What the agent does, for the agents that offer it as a tool (the
     * transfer_to_<name> of a handoff); may be NULL. */
    char *description;
    /* `handoffs: [name, ...]`: the agents this one may hand the run over
     * to (docs/agents.md "Handoffs"), each a defined agent other than
     * itself; handoffs_lines: the file's line of each, NULL when not read
     * from YAML. */
    char **handoffs;
    size_t handoffs_len;
    size_t *handoffs_lines;
    /*
     * `tool_options: {<tool>: {settings}}`: this agent's per-tool
     * settings, each tool's keys put over the config's `tools` entry for
     * its turns (loom__tool_settings_merge). An object, or NULL when the
     * key is absent.
     */
    json_t *tool_options;
    /* What a turn whose every call was to a tool not enabled for the
     * user ends with; "{tool}" is the tool's name. NULL: the built-in
     * one. */
    char *tools_disabled_message;
    /*
     * Sub-agents (docs/agents.md "Sub-agents"); description (above) is
     * their tool's description. sub_agents: agents offered to this one as
     * tools named after them (names of agents of the config, checked at
     * load; sub_agents_lines as tools_lines). count_sub_agent_calls: a
     * sub-agent's model and tool calls count toward this agent's
     * iterations (default 1). max_depth (default 3) and max_sub_runs
     * (default 50) bound the tree of runs this agent starts as the top
     * of a turn.
     */
    char **sub_agents;
    size_t sub_agents_len;
    size_t *sub_agents_lines;
    int count_sub_agent_calls;
    int max_depth;
    int max_sub_runs;
    /*
     * The agent's budget per run (docs/agents.md "Budgets"; keys
     * max_cost_usd, max_tokens, max_seconds), its sub-agents' calls
     * included: micro-dollars, tokens (prompt and output), seconds. 0:
     * none.
     */
    int64_t budget_cost_micros;
    long budget_tokens;
    long budget_seconds;
    loom_agent_retry retry;             /* retry_without_tool_calls */
    loom_agent_model_after model_after; /* model_after_retries */
    /* `non_iterative_tools`: tools whose turns cost no iteration; with
     * non_iterative_set unset, loom's think tool only. */
    char **non_iterative_tools;
    size_t non_iterative_tools_len;
    int non_iterative_set;
    /* `research: true`: the agent's turns are research runs
     * (docs/research.md) with the config's `research` section. */
    int research;
} loom_agent_config;

/*
 * The `research:` section (docs/research.md): the limits of research
 * runs, which a request may override key by key.
 *
 *   research:
 *     model: openai/gpt-4.1          # the supervisor; NULL: the agent's
 *     researcher_model: openai/gpt-4.1-mini   # NULL: the researcher's
 *     max_cycles: 8                  # supervisor cycles
 *     max_cycles_reasoning: 4        # with a reasoning model
 *     max_parallel_researchers: 5    # research_agent calls of one cycle
 *     researcher_max_searches: 3     # search/fetch rounds per researcher
 *     report_max_tokens: 10000       # a researcher's report, the report
 *     time_limit_s: 1800             # then the report is forced
 *     clarify: true                  # may ask one clarifying question
 *     min_context_tokens: 50000      # smaller windows are refused
 *     researcher_tools: [docs__search]  # offered to researchers too
 *     max_cost_usd: 2.50             # budget; 0: none
 *     max_tokens: 2000000            # budget; 0: none
 */
typedef struct {
    char *model;
    char *researcher_model;
    int max_cycles;
    int max_cycles_reasoning;
    int max_parallel_researchers;
    int researcher_max_searches;
    long report_max_tokens;
    long time_limit_s;
    int clarify;
    long min_context_tokens;
    char **researcher_tools;
    size_t researcher_tools_len;
    int64_t max_cost_micros; /* max_cost_usd in micro-dollars; 0: none */
    long max_tokens;         /* 0: none */
} loom_research_config;

#define LOOM_RESEARCH_DEFAULT_MAX_CYCLES 8
#define LOOM_RESEARCH_DEFAULT_MAX_CYCLES_REASONING 4
#define LOOM_RESEARCH_DEFAULT_PARALLEL 5
#define LOOM_RESEARCH_DEFAULT_SEARCHES 3
#define LOOM_RESEARCH_DEFAULT_REPORT_TOKENS 10000
#define LOOM_RESEARCH_DEFAULT_TIME_LIMIT_S 1800
#define LOOM_RESEARCH_DEFAULT_MIN_CONTEXT 50000

/* The built-in research agents, used when the config defines no agent of
 * that name (loom_config_agent answers with them). */
#define LOOM_RESEARCH_AGENT "deep_research"
#define LOOM_RESEARCHER_AGENT "deep_research_researcher"

/*
 * The `server:` section (loom serve; see docs/server.md):
 *
 *   server:
 *     listen: 127.0.0.1:8080      # HOST:PORT (port 0: any free port)
 *     db: ./data/loom.db          # the store
 *     secret_key: ${LOOM_SECRET_KEY} # seals the store's secrets (below)
 *     max_body_bytes: 4194304     # request bodies; larger ones get 413
 *     max_concurrent_runs: 64     # runs at once; more wait in the queue
 *     queue_max: 256              # requests waiting for a run slot
 *     queue_max_per_identity: 0   # of those, one caller's (0: a quarter)
 *     queue_wait_ms: 10000        # then 503 with Retry-After
 *     max_connections: 32768      # open client connections at once
 *     max_connections_per_address: 1024 # one client address (0: any)
 *     header_timeout_ms: 10000    # a request's headers must come this fast
 *     connection_memory_kb: 32    # per connection: request line + headers
 *     keepalive_ms: 15000         # SSE ": keep-alive" comment when idle
 *     read_timeout_ms: 30000      # a silent client is cut (whole seconds)
 *     shutdown_grace_ms: 10000    # runs may finish this long on SIGTERM
 *     keep_finished_runs: 1000    # ended runs kept in memory for GET
 *     max_run_events_bytes: 67108864 # one run's event log in memory
 *     cors_origins: [https://app.example.com]  # browsers' origins allowed
 *     ui: true                    # the web UI at / (docs/ui.md)
 *     public_url: https://loom.example.com  # how browsers reach it
 *     fibers: true                # runs as fibers on a worker pool
 *     workers: 0                  # its threads; 0: the number of cores
 *     tool_threads: 64            # threads for tool calls that block
 *     fiber_stack_kb: 256         # stack reserved per run / tool fiber
 */
typedef struct {
    char *listen;              /* "HOST:PORT", default 127.0.0.1:8080 */
    char *db;                  /* store location, default ./data/loom.db */
    char *secret_key;          /* what the store's secrets are sealed with (MCP
                                * OAuth tokens); NULL: $LOOM_SECRET_KEY, else a
                                * key file beside db (loom/store.h) */
    long max_body_bytes;       /* default 4 MiB */
    int max_concurrent_runs;   /* default 64 */
    /* Requests that wait for a run slot past max_concurrent_runs (0: none
     * wait, they get 503 at once), how many of them one caller may have
     * (0: a quarter of queue_max, at least 1; docs/server.md), and how
     * long one waits before its 503. */
    int queue_max;                   /* default 256 */
    int queue_max_per_identity;      /* default 0 */
    long queue_wait_ms;              /* default 10000 */
    int max_connections;             /* default 32768 */
    int max_connections_per_address; /* default 1024; 0: no limit */
    /* A connection must send its request's headers without going silent
     * this long (whole seconds, at most read_timeout_ms); after them
     * read_timeout_ms applies. */
    long header_timeout_ms;    /* default 10000 */
    /* libmicrohttpd's memory per connection, in KiB: the request line and
     * headers must fit in it with room for the answer's headers (the
     * largest header block served is documented in docs/server.md). */
    int connection_memory_kb;  /* default 32 */
    long keepalive_ms;         /* default 15000 */
    long read_timeout_ms;      /* default 30000 */
    long shutdown_grace_ms;    /* default 10000 */
    int keep_finished_runs;    /* default 1000 */
    long max_run_events_bytes; /* default 64 MiB */
    /* Origins ("https://host[:port]") whose browser pages may call the
     * server (CORS); none by default. */
    char **cors_origins;
    size_t cors_origins_len;
    int ui; /* serve the web UI at / and /assets/ (default 1) */
    /* Where browsers reach this server ("https://loom.example.com", no
     * trailing slash needed): the base of the OAuth redirect URI of users
     * connecting their MCP accounts (docs/mcp.md). NULL: http://HOST:PORT
     * of the listen address. */
    char *public_url;
    /* Runs execute as fibers on `workers` threads (loom/pool.h), default
     * 1; 0: a thread per run, as before. */
    int fibers;
    int workers;        /* default 0: the number of cores */
    int tool_threads;   /* default 64 */
    int fiber_stack_kb; /* default 256 */
} loom_server_config;

/*
 * `auth.jwt` (mode jwt; docs/accounts.md#jwt): tokens signed by an
 * identity provider. HS256 with secret, RS256 and ES256 with the keys of
 * jwks_file; at least one of the two. audience and issuer, when set, must
 * be the token's; workspace_claim names the claim holding the caller's
 * workspace (NULL: every user is in the default workspace).
 */
typedef struct {
    char *secret;          /* HS256 key; NULL: HS256 refused */
    char *jwks_file;       /* RS256/ES256 keys; NULL: refused */
    char *audience;        /* NULL: aud not checked */
    char *issuer;          /* NULL: iss not checked */
    char *workspace_claim; /* NULL: the default workspace */
    int leeway_seconds;    /* clock skew allowed on exp/nbf; default 60 */
} loom_jwt_config;

/*
 * The `auth:` section (who may call loom serve; docs/accounts.md):
 *
 *   auth:
 *     mode: keys                  # none | keys | jwt
 *     allow_unauthenticated: false # mode none on a non-loopback address
 *     admin_key: ${LOOM_ADMIN_KEY} # the admin API key (or the variable)
 *     jwt: {...}                   # mode jwt (loom_jwt_config)
 */
typedef struct {
    char *mode;                /* "none" (default), "keys" or "jwt" */
    int allow_unauthenticated; /* serve mode none beyond loopback */
    char *admin_key;           /* NULL: $LOOM_ADMIN_KEY, else none */
    loom_jwt_config jwt;       /* mode jwt */
} loom_auth_config;

/*
 * An HTTP tool declared under `http_tools:` (docs/tools.md): the model's
 * arguments are sent to a fixed URL as JSON (the body of POST, PUT and
 * PATCH) or as a query string (GET, DELETE), and the answer (status and
 * body, cut) is the tool's result. The network policy of web_fetch
 * applies: a host on a private network must be in allow_hosts.
 *
 *   http_tools:
 *     create_ticket:
 *       description: Open a ticket in the tracker.
 *       method: POST            # GET | POST | PUT | PATCH | DELETE
 *       url: https://tracker.example.com/api/tickets
 *       headers: {Authorization: "Bearer ${TRACKER_TOKEN}"}
 *       parameters:             # JSON Schema of the arguments
 *         type: object
 *         properties: {title: {type: string}}
 *         required: [title]
 *       allow_hosts: [tracker.internal:8080]  # web_fetch's syntax
 *       timeout_ms: 30000
 *       max_bytes: 1048576
 *       max_chars: 20000
 */
typedef struct {
    char *name;         /* the key: [a-zA-Z0-9_-]{1,64} */
    char *description;  /* required, not empty */
    char *method;       /* upper case; default POST */
    char *url;          /* an http:// or https:// URL */
    json_t *headers;    /* object: name -> value; never NULL */
    json_t *parameters; /* JSON Schema object; never NULL */
    char **allow_hosts; /* allowlist entries ("host", "host:port", ...) */
    size_t allow_hosts_len;
    long timeout_ms;    /* the whole call; default 30000 */
    long max_bytes;     /* response body; default 1 MiB */
    long max_chars;     /* characters of the body in the result; 20000 */
} loom_http_tool_config;

/*
 * An MCP server declared under `mcp_servers:` (docs/mcp.md): its tools are
 * offered as `<server>__<tool>`. Either a command started with stdio
 * (command, args, env, cwd) or a Streamable HTTP endpoint (url,
 * headers), never both.
 *
 *   mcp_servers:
 *     files:
 *       command: npx
 *       args: ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]
 *       env: {LOG_LEVEL: debug}   # added to a minimal environment
 *       cwd: /srv
 *       tools: [read_file]        # optional allow-list (server's names)
 *       timeout_ms: 60000         # one call
 *     tracker:
 *       url: https://mcp.example.com/mcp
 *       headers: {Authorization: "Bearer ${TRACKER_TOKEN}"}
 */
/*
 * The `oauth` of an HTTP MCP server (docs/mcp.md#oauth). Every field is
 * optional: discovery finds the authorization server, and a client is
 * registered dynamically (or named by a Client ID Metadata Document)
 * when no client_id is given.
 */
typedef struct {
    char *client_id;           /* a pre-registered client */
    char *client_secret;       /* its secret, NULL for a public client */
    char *auth_method;         /* client_secret_basic, client_secret_post,
                                * none, private_key_jwt; NULL: chosen */
    char *client_metadata_url; /* a Client ID Metadata Document (https) */
    char *client_name;         /* for registration; NULL: "loom" */
    char **scopes;             /* asked for in place of discovered ones */
    size_t scopes_len;
    char *grant_type;  /* authorization_code (default), client_credentials */
    char *private_key; /* PEM, for private_key_jwt */
    char *signing_alg; /* ES256 (default) or RS256 */
    int disabled;      /* `oauth: false`: never authorize */
} loom_mcp_oauth_config;

typedef struct {
    char *name;      /* the key: [a-zA-Z0-9_-]{1,64} */
    char *transport; /* "stdio", "http" or "sse" (the legacy HTTP+SSE
                        transport); from command/url if unset */
    char *command;   /* stdio: the program (searched in PATH) */
    char **args;     /* stdio: its arguments */
    size_t args_len;
    json_t *env;     /* stdio: object name -> value; never NULL */
    char *cwd;       /* stdio: working directory; NULL: loom's */
    char *url;       /* http: the endpoint */
    json_t *headers; /* http: object name -> value; never NULL */
    char **tools;    /* allow-list of the server's tool names; NULL: all */
    size_t tools_len;
    long timeout_ms;         /* one call; default 60000 */
    long startup_timeout_ms; /* start, handshake, tools/list; 30000 */
    /*
     * The protocol version to speak, which fixes the era: "2026-07-28"
     * (stateless: no handshake), "2025-11-25" and older (initialize).
     * NULL: probe with server/discover, fall back to initialize.
     */
    char *protocol_version;
    loom_mcp_oauth_config oauth; /* http: how to authorize */
    /*
     * `roots:` the directories the server may work in, given to it on
     * roots/list (and the roots capability declared): file:// URIs, or
     * paths (relative ones from loom's working directory), as written.
     * NULL: none, and no capability.
     */
    char **roots;
    size_t roots_len;
    /*
     * `sampling:` "allow" lets the server ask for model completions
     * (sampling/createMessage) during a run's call: they are made with the
     * run's model and counted in its usage (docs/mcp.md#sampling). NULL or
     * "deny" (the default): the capability is not declared and the
     * request is refused.
     */
    char *sampling;
    /* `sampling_max_tokens:` the most output tokens one sampling request
     * gets, whatever its maxTokens says; default 4096. */
    long sampling_max_tokens;
} loom_mcp_server_config;

#define LOOM_MCP_SAMPLING_MAX_TOKENS 4096

#define LOOM_SERVER_DEFAULT_LISTEN "127.0.0.1:8080"
#define LOOM_SERVER_DEFAULT_DB "./data/loom.db"

typedef struct {
    char *path; /* file it came from, NULL for environment only */
    char *source; /* the file's name in messages: path, or the name given
                   * to loom_config_load_string; NULL for environment
                   * only */
    loom_provider_config *providers;
    size_t providers_len;
    loom_model_config *models;
    size_t models_len;
    loom_agent_config *agents;
    size_t agents_len;
    char *default_agent; /* may be NULL */
    json_t *tools;       /* object: tool name -> settings object; never NULL */
    char *log_level;     /* may be NULL */
    char *log_format;    /* may be NULL */
    loom_server_config server; /* defaults unless the file sets them */
    loom_auth_config auth;     /* `auth:`; mode none by default */
    loom_routing_policy routing; /* default policy of every model */
    loom_http_tool_config *http_tools; /* `http_tools`, in file order */
    size_t http_tools_len;
    loom_mcp_server_config *mcp_servers; /* `mcp_servers`, in file order */
    size_t mcp_servers_len;
    loom_research_config research; /* defaults unless the file sets them */
} loom_config;

/*
 * A config from the environment alone: the providers of OPENAI_API_KEY,
 * OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, GEMINI_API_KEY
 * and GEMINI_BASE_URL (see above). LOOM_EINVALID when a *_BASE_URL is not
 * an http(s) URL.
 */
int loom_config_from_env(loom_config **out);

/* The most errors one load (or one check of a loaded config) lists;
 * past it, a last line says "... and N more errors". */
#define LOOM_CONFIG_MAX_ERRORS 20

/*
 * Reads the YAML file at path over the environment's config. Errors:
 * LOOM_ENOTFOUND (no such file), LOOM_EINVALID with "file:line: key:
 * problem" for a bad value, unknown key, missing ${VAR}, wrong type, or a
 * reference to a provider, model or agent that does not exist.
 *
 * Reading goes on past a bad value or key, so every error of the file is
 * found: the code returned is the first error's, and loom_error_last()
 * holds the first error as its first line, then the next ones, one per
 * line, as far as whole lines fit the message, then "... and N more
 * errors". A limit crossed (LOOM_ETOOLARGE), a YAML syntax error or
 * LOOM_ENOMEM stops the reading where it is.
 */
int loom_config_load(loom_config **out, const char *path);

/* Same, from YAML text; name is used in messages in place of a path. */
int loom_config_load_string(loom_config **out, const char *yaml,
                            const char *name);

/*
 * loom_config_load and loom_config_load_string that also give the whole
 * list: on failure *errors (caller frees) gets every error, one per line
 * (the first LOOM_CONFIG_MAX_ERRORS, then "... and N more errors"), where
 * loom_error_last() may have to stop early; NULL on success or
 * LOOM_ENOMEM.
 */
int loom_config_load_report(loom_config **out, const char *path, char **errors);
int loom_config_load_string_report(loom_config **out, const char *yaml,
                                   const char *name, char **errors);

void loom_config_free(loom_config *cfg);

/* Lookups; NULL when absent. Borrowed from cfg. loom_config_agent also
 * answers LOOM_RESEARCH_AGENT and LOOM_RESEARCHER_AGENT with loom's
 * built-in agents when cfg defines none of that name. */
const loom_provider_config *loom_config_provider(const loom_config *cfg,
                                                 const char *name);
const loom_agent_config *loom_config_agent(const loom_config *cfg,
                                           const char *name);

/*
 * Resolves "provider/model" to a model entry. A listed model is returned
 * as is; an unlisted one whose provider exists is filled into *tmp with
 * the defaults (capabilities, no prices, no fallbacks, the config's
 * routing policy; strings are copies: free with loom_model_config_clear).
 * LOOM_ENOTFOUND names what is missing.
 */
int loom_config_model(const loom_model_config **out, loom_model_config *tmp,
                      const loom_config *cfg, const char *name);
void loom_model_config_clear(loom_model_config *m);

/*
 * The model used when neither a request, an option nor an agent names
 * one: $LOOM_MODEL, else the first listed model, else the first
 * provider's well-known model ("openai/gpt-4o-mini",
 * "anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-flash"). *out (caller
 * frees) is NULL when there is no provider at all. LOOM_ENOMEM.
 */
int loom_config_default_model(char **out, const loom_config *cfg);
/* The well-known model of a provider kind (gpt-4o-mini for unknown). */
const char *loom_config_kind_default_model(const char *kind);
/*
 * The context window in tokens of a well-known model by its upstream id
 * ("gpt-4o-mini": 128000, "claude-sonnet-4-5": 200000,
 * "gemini-2.5-flash": 1048576); 0 when unknown.
 */
long loom_config_known_context_window(const char *upstream);
/*
 * 1 when a model, by its upstream id, takes its output limit only as
 * max_completion_tokens and refuses max_tokens (OpenAI's reasoning
 * models: o1, o3, o4 and gpt-5, with or without a provider's "openai/"
 * prefix); else 0.
 */
int loom_config_known_max_completion_tokens(const char *upstream);

/* Parses "auto", "none", "required" or a tool name. */
int loom_tool_choice_parse(loom_tool_choice *out, const char *s);

/*
 * Parses a price in dollars per million tokens, written as a decimal
 * ("3", "0.15", "2.50", at most 6 digits after the point, no sign or
 * exponent), exactly into micro-dollars per million tokens: "0.15" gives
 * 150000, with no floating point on the way. LOOM_EINVALID for anything
 * else or above LOOM_PRICE_MAX_MICROS; *out is then untouched.
 */
int loom_price_parse(int64_t *out, const char *text);

#ifdef __cplusplus
}
#endif
#endif
