/*
 * embed.c: libloom in a program of its own, through the public headers
 * only (docs/embedding.md).
 *
 * The program brings its own three parts: a tool (`add`, which sums two
 * integers), a sink (prints every event of a turn) and a provider (a
 * tiny scripted model: asked a question with two numbers in it, it calls
 * `add`; shown the tool's result, it answers with it and says which
 * question of the conversation this was). It then runs three turns
 * through the session layer:
 *
 *   1. without a store, the history given by the program;
 *   2. with a store (a SQLite file), a new conversation;
 *   3. with the store, continuing that conversation: the history comes
 *      back from the store, so the model sees its second question.
 *
 * and reads the conversation back from the store. Every answer is checked;
 * the last line is "embed: ok" and the exit status 0 when all went as
 * expected, else the status is 1 and stderr says why.
 *
 * Build: cc embed.c $(pkg-config --cflags --libs loom) -o embed
 * Run:   ./embed [path/of/a/new.db]  (default: a file in a new /tmp folder)
 */
#define _POSIX_C_SOURCE 200809L /* strdup, mkdtemp under -std=c11 */

#include <loom.h>

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the tool ---------------------------------------------------------- */

/* add's payload: how many times it ran. Tools run on worker threads,
 * possibly several at once, hence the atomic. It outlives the registry. */
static atomic_int add_calls;

/* {"a": integer, "b": integer}: the run checks the model's arguments
 * against this schema before add_execute sees them. */
static const char add_schema[] =
    "{\"type\": \"object\","
    " \"properties\": {"
    "  \"a\": {\"type\": \"integer\", \"minimum\": -1000000000,"
    "         \"maximum\": 1000000000},"
    "  \"b\": {\"type\": \"integer\", \"minimum\": -1000000000,"
    "         \"maximum\": 1000000000}},"
    " \"required\": [\"a\", \"b\"], \"additionalProperties\": false}";

/* Writes a + b (what the model reads) into out. */
static int add_execute(const json_t *args, const loom_tool_ctx *ctx,
                       loom_buf *out, void *payload)
{
    atomic_int *calls = payload;
    json_int_t a = json_integer_value(json_object_get(args, "a"));
    json_int_t b = json_integer_value(json_object_get(args, "b"));

    (void)ctx;
    atomic_fetch_add(calls, 1);
    return loom_buf_printf(out, "%" JSON_INTEGER_FORMAT, a + b);
}

/* A registry holding add; the caller frees it. */
static int tools_new(loom_tool_registry **out)
{
    loom_tool tool = LOOM_TOOL_INIT;
    json_error_t jerr;
    json_t *schema;
    int rc;

    *out = NULL;
    if (!(schema = json_loads(add_schema, 0, &jerr))) {
        fprintf(stderr, "embed: add's schema: %s\n", jerr.text);
        return LOOM_EINVALID;
    }
    tool.name = "add";
    tool.description = "Adds two integers.";
    tool.parameters = schema;
    tool.execute = add_execute;
    tool.payload = &add_calls;
    if ((rc = loom_tool_registry_new(out)) == 0 &&
        (rc = loom_tool_registry_add(*out, &tool)) != 0) {
        loom_tool_registry_free(*out);
        *out = NULL;
    }
    json_decref(schema); /* the registry keeps its own reference */
    return rc;
}

/* ---- the provider -------------------------------------------------------- */

/* A loom_provider first, so &m->base is the provider. */
typedef struct {
    loom_provider base;
    atomic_int calls; /* complete() runs on the thread of each turn */
} scripted_model;

/* The first two integers of text; 0 when it has fewer. */
static int two_numbers(const char *text, long *a, long *b)
{
    long *dst[2] = {a, b};
    int n = 0;

    for (const char *p = text; p && *p && n < 2;) {
        char *end;

        if (!isdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        *dst[n++] = strtol(p, &end, 10);
        p = end;
    }
    return n == 2;
}

/* Streams text as two deltas, as a real model streams its answer. */
static int stream_text(const char *text, loom_llm_event_cb cb, void *payload)
{
    size_t len = strlen(text), half = len / 2;
    loom_llm_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_LLM_TEXT;
    ev.text = text;
    ev.text_len = half;
    if (cb(&ev, payload))
        return LOOM_ECANCELED;
    ev.text = text + half;
    ev.text_len = len - half;
    return cb(&ev, payload) ? LOOM_ECANCELED : 0;
}

/* The answer to a question: one call of add with its two numbers. */
static int answer_call(const char *question, int turn, loom_llm_event_cb cb,
                       void *payload, loom_llm_response *resp)
{
    char id[32], args[96];
    long a, b;
    loom_llm_event ev;

    if (!two_numbers(question, &a, &b))
        return stream_text("Ask me to add two numbers.", cb, payload);
    snprintf(id, sizeof(id), "call_%d", turn);
    snprintf(args, sizeof(args), "{\"a\": %ld, \"b\": %ld}", a, b);
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = 0;
    ev.tool_id = id;
    ev.tool_name = "add";
    ev.args_delta = args;
    if (cb(&ev, payload))
        return LOOM_ECANCELED;
    if (!(resp->tool_calls = calloc(1, sizeof(*resp->tool_calls))))
        return LOOM_ENOMEM;
    resp->tool_calls_len = 1;
    resp->tool_calls[0].id = strdup(id);
    resp->tool_calls[0].name = strdup("add");
    resp->tool_calls[0].arguments = strdup(args);
    if (!resp->tool_calls[0].id || !resp->tool_calls[0].name ||
        !resp->tool_calls[0].arguments || !(resp->text = strdup("")))
        return LOOM_ENOMEM;
    return 0;
}

/* The answer once add has answered: "a + b = result (question n of this
 * conversation)", a and b read back from the model's own call. */
static int answer_result(const loom_llm_request *req, int question,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp)
{
    const loom_message *result = &req->messages[req->messages_len - 1];
    const loom_message *call = req->messages_len > 1 ? result - 1 : NULL;
    json_t *args = NULL;
    char text[256];
    int rc;

    if (call && call->role == LOOM_ROLE_ASSISTANT && call->tool_calls_len)
        args = json_loads(call->tool_calls[0].arguments, 0, NULL);
    if (!args)
        return LOOM_EPROTO;
    snprintf(text, sizeof(text),
             "%" JSON_INTEGER_FORMAT " + %" JSON_INTEGER_FORMAT
             " = %s (question %d of this conversation)",
             json_integer_value(json_object_get(args, "a")),
             json_integer_value(json_object_get(args, "b")),
             result->content ? result->content : "?", question);
    json_decref(args);
    if ((rc = stream_text(text, cb, payload)) != 0)
        return rc;
    return (resp->text = strdup(text)) ? 0 : LOOM_ENOMEM;
}

/*
 * loom_provider_vtable.complete: answers from the conversation alone
 * (no state between calls). Emits events as it goes and fills *resp
 * (zeroed by the caller, who frees what is in it).
 */
static int scripted_complete(loom_provider *p, const loom_llm_request *req,
                             loom_llm_event_cb cb, void *payload,
                             loom_llm_response *resp, loom_cancel *cancel)
{
    scripted_model *m = (scripted_model *)p;
    const loom_message *last;
    int questions = 0, rc;

    if (loom_cancel_is_set(cancel))
        return LOOM_ECANCELED;
    if (!req->messages_len)
        return LOOM_EINVALID;
    atomic_fetch_add(&m->calls, 1);
    for (size_t i = 0; i < req->messages_len; i++)
        questions += req->messages[i].role == LOOM_ROLE_USER;
    last = &req->messages[req->messages_len - 1];
    if (last->role == LOOM_ROLE_TOOL)
        rc = answer_result(req, questions, cb, payload, resp);
    else
        rc = answer_call(last->content, questions, cb, payload, resp);
    if (rc != 0)
        return rc;
    resp->usage.prompt_tokens = 10 * (long)req->messages_len;
    resp->usage.completion_tokens = 5;
    resp->usage.total_tokens = resp->usage.prompt_tokens + 5;
    resp->output_started = 1;
    resp->finish_reason = strdup(resp->tool_calls_len ? "tool_calls" : "stop");
    return resp->finish_reason ? 0 : LOOM_ENOMEM;
}

static void scripted_free(loom_provider *p)
{
    free(p->name);
    free(p);
}

static const loom_provider_vtable scripted_vt = {
    .version = LOOM_PROVIDER_VTABLE_VERSION,
    .complete = scripted_complete,
    .free = scripted_free,
};

/* A new scripted model; loom_provider_free() frees it. */
static int scripted_new(scripted_model **out)
{
    scripted_model *m = calloc(1, sizeof(*m));

    if (!m || !(m->base.name = strdup("scripted"))) {
        free(m);
        return LOOM_ENOMEM;
    }
    m->base.vt = &scripted_vt;
    *out = m;
    return 0;
}

/* ---- the sink ------------------------------------------------------------ */

/* What one turn's sink saw. */
typedef struct {
    int events;
    loom_event_type first, last;
} event_log;

/* loom_sink.emit: prints each event on a line of its own. Called on the
 * thread that executes the turn, one event at a time. */
static int print_event(const loom_event *ev, void *payload)
{
    event_log *log = payload;
    const json_t *d = ev->data;

    if (log->events++ == 0)
        log->first = ev->type;
    log->last = ev->type;
    printf("  event %s", loom_event_type_name(ev->type));
    switch (ev->type) {
    case LOOM_EV_MESSAGE_DELTA:
        printf(" \"%s\"", json_string_value(json_object_get(d, "delta")));
        break;
    case LOOM_EV_TOOL_STARTED:
        printf(" %s", json_string_value(json_object_get(d, "name")));
        break;
    case LOOM_EV_TOOL_COMPLETED:
        printf(" %s -> %s", json_string_value(json_object_get(d, "name")),
               json_string_value(json_object_get(d, "output")));
        break;
    default:
        break;
    }
    putchar('\n');
    return 0; /* non-zero would cancel the turn */
}

/* ---- turns --------------------------------------------------------------- */

/*
 * Runs one turn of s asking question, after history (NULL: none, or the
 * store's when conv continues a conversation), and checks that it
 * answered `expect`. The conversation's id goes to conv_out (may be
 * NULL). 0, or -1 after saying why on stderr.
 */
static int ask(loom_session *s, const char *label, const loom_messages *history,
               const char *conv, const char *question, const char *expect,
               char conv_out[LOOM_ID_MAX + 1])
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages input = {0};
    event_log log = {0};
    loom_turn *t = NULL;
    const char *text;
    int rc, ok = -1;

    printf("%s > %s\n", label, question);
    if ((rc = loom_messages_add(&input, LOOM_ROLE_USER, question)) != 0)
        goto done;
    to.input = &input;
    to.history = history;
    to.conversation_id = conv;
    to.system_prompt = "Add numbers with the add tool.";
    to.sink.emit = print_event;
    to.sink.payload = &log;
    if ((rc = loom_turn_new(&t, s, &to)) != 0 ||
        (rc = loom_turn_execute(t)) != 0)
        goto done;
    text = loom_run_text(loom_turn_run(t));
    printf("%s: %s\n", label, text);
    if (strcmp(text, expect) != 0) {
        fprintf(stderr, "embed: %s: expected \"%s\"\n", label, expect);
    } else if (log.first != LOOM_EV_RUN_STARTED ||
               log.last != LOOM_EV_RUN_COMPLETED) {
        fprintf(stderr, "embed: %s: the sink did not see the turn whole\n",
                label);
    } else if (loom_session_store(s) && !loom_turn_stored(t)) {
        fprintf(stderr, "embed: %s: not stored: %s\n", label,
                loom_turn_store_error(t));
    } else {
        const char *id = loom_turn_conversation_id(t); /* NULL: none */

        if (conv_out)
            snprintf(conv_out, LOOM_ID_MAX + 1, "%s", id ? id : "");
        ok = 0;
    }
done:
    if (rc != 0)
        fprintf(stderr, "embed: %s: %s (%s)\n", label, loom_error_last(),
                loom_error_name(rc));
    loom_turn_free(t);
    loom_messages_free(&input);
    return ok;
}

/* A session over the program's own provider and tools, and store (NULL:
 * none). */
static int session_new(loom_session **out, scripted_model *model,
                       const loom_tool_registry *tools, loom_store *store)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;

    so.provider = &model->base;
    so.model = "scripted-1";
    so.tools = tools;
    so.store = store;
    return loom_session_new(out, &so);
}

/* Turn 1: no store, an earlier exchange given as history. */
static int without_store(scripted_model *model, const loom_tool_registry *tools)
{
    loom_session *s = NULL;
    loom_messages history = {0};
    int rc;

    if ((rc = loom_messages_add(&history, LOOM_ROLE_USER,
                                "What is 1 plus 1?")) != 0 ||
        (rc = loom_messages_add(&history, LOOM_ROLE_ASSISTANT,
                                "1 + 1 = 2 (question 1 of this "
                                "conversation)")) != 0 ||
        (rc = session_new(&s, model, tools, NULL)) != 0) {
        fprintf(stderr, "embed: %s\n", loom_error_last());
        rc = -1;
    } else {
        rc = ask(s, "no store", &history, NULL, "What is 2 plus 40?",
                 "2 + 40 = 42 (question 2 of this conversation)", NULL);
    }
    loom_session_free(s);
    loom_messages_free(&history);
    return rc;
}

/* Turns 2 and 3: a store, a new conversation and its continuation. */
static int with_store(scripted_model *model, const loom_tool_registry *tools,
                      const char *path)
{
    loom_store *store = NULL;
    loom_session *s = NULL;
    loom_messages stored = {0};
    char conv[LOOM_ID_MAX + 1] = "";
    int rc = -1;

    if (loom_store_open(&store, path) != 0 ||
        session_new(&s, model, tools, store) != 0) {
        fprintf(stderr, "embed: %s: %s\n", path, loom_error_last());
        goto done;
    }
    if (ask(s, "store", NULL, NULL, "What is 2 plus 40?",
            "2 + 40 = 42 (question 1 of this conversation)", conv) != 0)
        goto done;
    printf("store: conversation %s\n", conv);
    if (ask(s, "store, continued", NULL, conv, "And 5 plus 7?",
            "5 + 7 = 12 (question 2 of this conversation)", NULL) != 0)
        goto done;
    /* Each turn stored four messages: question, call, result, answer. */
    if (loom_store_load_history(store, conv, &stored) != 0) {
        fprintf(stderr, "embed: reading back: %s\n", loom_error_last());
        goto done;
    }
    printf("store: %zu messages stored\n", stored.len);
    if (stored.len != 8)
        fprintf(stderr, "embed: expected 8 stored messages\n");
    else
        rc = 0;
done:
    loom_messages_free(&stored);
    loom_session_free(s);
    loom_store_free(store); /* after the session that borrows it */
    return rc;
}

/* Removes the database a run made in /tmp, with SQLite's side files. */
static void remove_db(const char *dir, const char *path)
{
    char side[4096];

    unlink(path);
    snprintf(side, sizeof(side), "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof(side), "%s-shm", path);
    unlink(side);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/loom-embed-XXXXXX", path[sizeof(dir) + 16];
    scripted_model *model = NULL;
    loom_tool_registry *tools = NULL;
    int made_dir = 0, status = 1;

    if (argc > 2) {
        fprintf(stderr, "usage: %s [path/of/a/new.db]\n", argv[0]);
        return 2;
    }
    printf("embed: libloom %s\n", loom_version());
    if (scripted_new(&model) != 0 || tools_new(&tools) != 0) {
        fprintf(stderr, "embed: setup: %s\n", loom_error_last());
        goto done;
    }
    if (argc < 2) {
        if (!mkdtemp(dir)) {
            perror("embed: mkdtemp");
            goto done;
        }
        made_dir = 1;
        snprintf(path, sizeof(path), "%s/embed.db", dir);
    }
    if (without_store(model, tools) != 0 ||
        with_store(model, tools, argc > 1 ? argv[1] : path) != 0)
        goto done;
    printf("embed: %d model calls, %d tool calls\n", atomic_load(&model->calls),
           atomic_load(&add_calls));
    if (atomic_load(&model->calls) != 6 || atomic_load(&add_calls) != 3) {
        fprintf(stderr, "embed: expected 6 model calls, 3 tool calls\n");
        goto done;
    }
    puts("embed: ok");
    status = 0;
done:
    /* The sessions are gone: nothing uses the tools or the model now. */
    loom_tool_registry_free(tools);
    loom_provider_free(model ? &model->base : NULL);
    if (made_dir)
        remove_db(dir, path);
    return status;
}
