/*
 * Replays the fuzz corpus in the ordinary test suite, without libFuzzer:
 * every file under fuzz/corpus/<target>/ (and fuzz/crashes-found/<target>/
 * when it exists) goes through the same entry logic as the fuzz target,
 * whose source is included here with LOOM_FUZZ_NO_ENTRY defined (the
 * SSE target has no such switch and keeps its LLVMFuzzerTestOneInput,
 * which is simply called). The targets abort on any broken rule, and the
 * suite runs under ASan, so a seed or a saved crash input that goes wrong
 * fails here. A few seeds are also checked to reach the paths they were
 * written for, so the corpus cannot silently rot into rejected inputs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define LOOM_FUZZ_NO_ENTRY 1
#include "../../fuzz/fuzz_anthropic_stream.c"
#include "../../fuzz/fuzz_chat_request.c"
#include "../../fuzz/fuzz_config.c"
#include "../../fuzz/fuzz_gemini_stream.c"
#include "../../fuzz/fuzz_openai_stream.c"
#include "../../fuzz/fuzz_responses_stream.c"
#include "../../fuzz/fuzz_runs_request.c"
#include "../../fuzz/fuzz_schema.c"
#include "../../fuzz/fuzz_sse.c"

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Largest corpus file replayed; seeds are a few KiB. */
#define CORPUS_MAX_FILE (1u << 20)

typedef int (*entry_fn)(const uint8_t *data, size_t size);

static const struct {
    const char *name;
    entry_fn entry;
} targets[] = {
    {"fuzz_openai_stream", fuzz_openai_stream_one},
    {"fuzz_anthropic_stream", fuzz_anthropic_stream_one},
    {"fuzz_gemini_stream", fuzz_gemini_stream_one},
    {"fuzz_responses_stream", fuzz_responses_stream_one},
    {"fuzz_chat_request", fuzz_chat_request_one},
    {"fuzz_runs_request", fuzz_runs_request_one},
    {"fuzz_config", fuzz_config_one},
    {"fuzz_schema", fuzz_schema_one},
    {"fuzz_sse", LLVMFuzzerTestOneInput},
};

#define NTARGETS (sizeof(targets) / sizeof(targets[0]))

static char *corpus_path(const char *top, const char *target,
                         const char *file)
{
    char *p = NULL;

    if (asprintf(&p, "%s/fuzz/%s%s%s%s%s", LOOM_SOURCE_DIR, top,
                 target ? "/" : "", target ? target : "", file ? "/" : "",
                 file ? file : "") < 0)
        return NULL;
    return p;
}

/*
 * Runs every regular file of <top>/<target> through entry; returns how
 * many. A folder that cannot be read (missing) fails the test.
 */
static int replay_dir(const char *top, const char *target, entry_fn entry)
{
    char *dir = corpus_path(top, target, NULL);
    struct dirent *de;
    DIR *dh;
    int n = 0;

    assert_non_null(dir);
    dh = opendir(dir);
    if (!dh)
        fail_msg("fuzz/%s/%s: %s", top, target, strerror(errno));
    while ((de = readdir(dh)) != NULL) {
        char *path = corpus_path(top, target, de->d_name);
        struct stat st;
        size_t len = 0;
        char *data;

        assert_non_null(path);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(path);
            continue;
        }
        assert_true((size_t)st.st_size <= CORPUS_MAX_FILE);
        data = test_read_file(path, &len);
        assert_non_null(data);
        /* Copy to an exact-size block so ASan sees reads past the end. */
        {
            uint8_t *exact = malloc(len ? len : 1);
            assert_non_null(exact);
            memcpy(exact, data, len);
            entry(exact, len);
            free(exact);
        }
        free(data);
        free(path);
        n++;
    }
    closedir(dh);
    free(dir);
    return n;
}

static entry_fn target_entry(const char *name)
{
    for (size_t i = 0; i < NTARGETS; i++)
        if (strcmp(targets[i].name, name) == 0)
            return targets[i].entry;
    return NULL;
}

/* Every target has seeds, and they all pass. */
static void test_replay_corpus(void **state)
{
    (void)state;
    for (size_t i = 0; i < NTARGETS; i++) {
        int n = replay_dir("corpus", targets[i].name, targets[i].entry);
        if (n < 1)
            fail_msg("no seeds for %s", targets[i].name);
    }
}

/*
 * Runs every folder of fuzz/<top> through its target's entry (each must
 * name a target replayed here and hold at least one input); returns how
 * many folders. fuzz/<top> itself must exist.
 */
static int replay_top(const char *top)
{
    char *dir = corpus_path(top, NULL, NULL);
    struct dirent *de;
    DIR *dh;
    int folders = 0;

    assert_non_null(dir);
    dh = opendir(dir);
    if (!dh)
        fail_msg("fuzz/%s: %s", top, strerror(errno));
    while ((de = readdir(dh)) != NULL) {
        entry_fn entry;
        if (de->d_name[0] == '.')
            continue;
        if (!(entry = target_entry(de->d_name)))
            fail_msg("fuzz/%s/%s has no replay entry", top, de->d_name);
        if (replay_dir(top, de->d_name, entry) < 1)
            fail_msg("fuzz/%s/%s is empty", top, de->d_name);
        folders++;
    }
    closedir(dh);
    free(dir);
    return folders;
}

/* Every folder under fuzz/corpus belongs to a target replayed here. */
static void test_no_unknown_corpus(void **state)
{
    (void)state;
    assert_int_equal(replay_top("corpus"), (int)NTARGETS);
}

/* Inputs saved from fuzzing runs: every fuzz/crashes-found/<target>/
 * (a target without findings has no folder). */
static void test_replay_crashes_found(void **state)
{
    (void)state;
    assert_true(replay_top("crashes-found") >= 1);
}

/* The degenerate inputs: nothing, one byte, a lone NUL. */
static void test_tiny_inputs(void **state)
{
    static const uint8_t bytes[] = {0x00, 0xff, '{', '\n'};

    (void)state;
    for (size_t i = 0; i < NTARGETS; i++) {
        uint8_t *none = malloc(1);
        assert_non_null(none);
        targets[i].entry(none, 0);
        free(none);
        for (size_t k = 0; k < sizeof(bytes); k++) {
            uint8_t *one = malloc(1);
            assert_non_null(one);
            one[0] = bytes[k];
            targets[i].entry(one, 1);
            free(one);
        }
    }
}

/* Decodes a seed body (after its control byte) with generous limits. */
static int decode_seed(const char *file, int complete, fan_state *st)
{
    char *path = corpus_path("corpus", "fuzz_openai_stream", file);
    loom__openai_limits lim = {0};
    loom__openai_decoder *d = NULL;
    size_t len = 0;
    char *data;
    int rc;

    assert_non_null(path);
    data = test_read_file(path, &len);
    assert_non_null(data);
    assert_true(len > 1);
    fan_state_init(st, -1);
    assert_int_equal(loom__openai_decoder_new(&d, &lim, fan_on_event, st), 0);
    if (complete) {
        rc = loom__openai_decoder_complete(d, data + 1, len - 1);
    } else {
        rc = loom__openai_decoder_feed(d, data + 1, len - 1);
        if (!rc)
            rc = loom__openai_decoder_finish(d);
    }
    fan_check_result(d, st, rc);
    loom__openai_decoder_free(d);
    free(data);
    free(path);
    return rc;
}

/* The hand-written OpenAI seeds reach the paths they were written for. */
static void test_openai_seeds_reach_their_paths(void **state)
{
    fan_state st;

    (void)state;
    assert_int_equal(decode_seed("tool_calls.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 2);
    assert_int_equal(st.nusage, 1);
    assert_int_equal(st.nfinish, 1);

    assert_int_equal(decode_seed("complete.bin", 1, &st), 0);
    assert_int_equal(st.calls_len, 2);
    assert_true(st.reasoning_seen);

    assert_int_equal(decode_seed("reasoning.bin", 0, &st), 0);
    assert_true(st.reasoning_seen);

    assert_int_equal(decode_seed("error_event.bin", 0, &st), LOOM_EUPSTREAM);
    assert_int_equal(st.nerror, 1);
    assert_int_equal(decode_seed("complete_error.bin", 1, &st), LOOM_EUPSTREAM);
    assert_int_equal(decode_seed("no_done.bin", 0, &st), LOOM_EUPSTREAM);
    assert_int_equal(decode_seed("stream-works-1.bin", 0, &st), 0);
    assert_true(st.count > 2);
}

/* The harness's own checks see a cancel: a callback refusing event 1. */
static void test_openai_cancel_checked(void **state)
{
    static const char body[] =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}"
        "\n\n"
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}"
        "\n\n";
    loom__openai_decoder *d = NULL;
    fan_state st;
    int rc;

    (void)state;
    fan_state_init(&st, 1);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, fan_on_event, &st), 0);
    rc = loom__openai_decoder_feed(d, body, sizeof(body) - 1);
    assert_int_equal(rc, LOOM_ECANCELED);
    assert_true(st.canceled);
    assert_int_equal(st.count, 1);
    fan_check_result(d, &st, rc);
    loom__openai_decoder_free(d);
}

/*
 * Decodes a seed of a decoder target (after its control byte) with
 * make, default limits and 0xff's own ones, as a stream or (complete)
 * as a whole body; fills *st and returns the result.
 */
static int decode_any(fan_new_fn make, const char *target, const char *file,
                      int complete, fan_state *st)
{
    char *path = corpus_path("corpus", target, file);
    size_t len = 0;
    char *data;
    fan_ctl c;
    void *d = NULL;
    int rc;

    assert_non_null(path);
    data = test_read_file(path, &len);
    assert_non_null(data);
    assert_true(len > 1);
    memset(&c, 0, sizeof(c));
    c.b = 0xff;
    c.body = data + 1;
    c.len = c.cut = len - 1;
    c.cancel_at = -1;
    fan_state_init(st, -1);
    if (complete) {
        assert_int_equal(make(&d, &c, fan_on_event, st), 0);
        rc = loom__llm_answer_complete(d, c.body, c.len);
        fan_check_result(d, st, rc);
        loom__llm_answer_free(d);
    } else {
        rc = fan_stream(make, &c, c.cut, st);
    }
    free(data);
    free(path);
    return rc;
}

/* The hand-written Anthropic, Gemini and Responses seeds reach the paths
 * they were written for. */
static void test_decoder_seeds_reach_their_paths(void **state)
{
    static const char *const an = "fuzz_anthropic_stream",
                             *const gm = "fuzz_gemini_stream",
                             *const rs = "fuzz_responses_stream";
    fan_state st;

    (void)state;
    assert_int_equal(
        decode_any(fan_anthropic_new, an, "thinking_tools.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 2);
    assert_true(st.reasoning_seen);
    assert_int_equal(st.nusage, 1);
    assert_int_equal(
        decode_any(fan_anthropic_new, an, "message_object.bin", 1, &st), 0);
    assert_int_equal(st.calls_len, 1);
    assert_int_equal(
        decode_any(fan_anthropic_new, an, "error_event.bin", 0, &st),
        LOOM_EUPSTREAM);
    assert_int_equal(
        decode_any(fan_anthropic_new, an, "cut_before_stop.bin", 0, &st),
        LOOM_EUPSTREAM);
    assert_int_equal(
        decode_any(fan_anthropic_new, an, "tool_use_response.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 1);

    assert_int_equal(
        decode_any(fan_gemini_new, gm, "thoughts_calls.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 2);
    assert_true(st.reasoning_seen);
    assert_int_equal(decode_any(fan_gemini_new, gm, "array_body.bin", 1, &st),
                     0);
    assert_int_equal(st.calls_len, 1);
    assert_int_equal(decode_any(fan_gemini_new, gm, "error_object.bin", 1, &st),
                     LOOM_EUPSTREAM);
    assert_int_equal(decode_any(fan_gemini_new, gm, "error-0.bin", 0, &st),
                     LOOM_EUPSTREAM);
    assert_int_equal(
        decode_any(fan_gemini_new, gm, "function-calling-0.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 1);

    assert_int_equal(
        decode_any(fan_responses_new, rs, "tools_reasoning.bin", 0, &st), 0);
    assert_int_equal(st.calls_len, 2);
    assert_true(st.reasoning_seen);
    assert_int_equal(
        decode_any(fan_responses_new, rs, "response_object.bin", 1, &st), 0);
    assert_int_equal(st.calls_len, 1);
    assert_int_equal(decode_any(fan_responses_new, rs, "failed.bin", 0, &st),
                     LOOM_EUPSTREAM);
    assert_int_equal(
        decode_any(fan_responses_new, rs, "cut_no_terminal.bin", 0, &st),
        LOOM_EUPSTREAM);
    assert_int_equal(decode_any(fan_responses_new, rs,
                                "stream-reasoning-works-1.bin", 0, &st),
                     0);
    assert_true(st.reasoning_seen);
}

/* The request seeds with every parameter are valid requests, so the
 * fuzzer starts from bodies that get past the parsers' first checks. */
static void test_request_seeds_parse(void **state)
{
    char *path =
        corpus_path("corpus", "fuzz_chat_request", "every_parameter.json");
    loom__chat_request cq;
    loom__chat_error err;
    srv_runs_request rq;
    size_t len = 0;
    char *data;
    json_t *body;

    (void)state;
    assert_non_null(path);
    assert_non_null(data = test_read_file(path, &len));
    assert_int_equal(loom__chat_request_parse_text(&cq, data, len, &err), 0);
    assert_int_equal(cq.messages.len, 7);
    assert_int_equal(cq.tool_names_len, 2);
    assert_int_equal(cq.client_tools_len, 1);
    assert_int_equal(cq.tool_choice.kind, LOOM_TOOL_CHOICE_FUNCTION);
    loom__chat_request_clear(&cq);
    free(data);
    free(path);

    path = corpus_path("corpus", "fuzz_runs_request", "every_parameter.json");
    assert_non_null(path);
    assert_non_null(data = test_read_file(path, &len));
    assert_non_null(body = json_loadb(data, len, 0, NULL));
    assert_int_equal(srv_runs_request_parse(&rq, body, NULL, &err), 0);
    assert_int_equal(rq.input.len, 5);
    assert_int_equal(rq.spec.tool_names_len, 2);
    assert_int_equal(rq.spec.max_iterations, 5);
    assert_true(rq.stream);
    srv_runs_request_clear(&rq);
    json_decref(body);
    free(data);
    free(path);
}

/* The config seeds taken from the repository load whole. */
static void test_config_seeds_load(void **state)
{
    static const char *const files[] = {"loom.example.yaml", "full.yaml",
                                        "minimal.yaml", "env.yaml"};

    (void)state;
    setenv("OPENAI_API_KEY", "sk-fuzz", 0);
    setenv("LOOM_TEST_FULL_KEY", "sk-fuzz-full", 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char *path = corpus_path("corpus", "fuzz_config", files[i]);
        loom_config *cfg = NULL;

        assert_non_null(path);
        if (loom_config_load(&cfg, path) != 0)
            fail_msg("%s: %s", files[i], loom_error_last());
        assert_non_null(cfg);
        fcf_walk(cfg);
        loom_config_free(cfg);
        free(path);
    }
}

/* The schema seeds fail as meant (each pairs a schema with a bad value). */
static void test_schema_seeds_reject(void **state)
{
    static const char *const bad[] = {"object.bin", "array.bin", "nested.bin",
                                      "bool_schema.bin"};

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = corpus_path("corpus", "fuzz_schema", bad[i]);
        size_t len = 0, cut;
        char *data, *msg = NULL;
        json_t *schema, *value;

        assert_non_null(path);
        data = test_read_file(path, &len);
        assert_non_null(data);
        cut = strlen(data);
        assert_true(cut < len);
        schema = json_loadb(data, cut, JSON_DECODE_ANY, NULL);
        value = json_loadb(data + cut + 1, len - cut - 1, JSON_DECODE_ANY,
                           NULL);
        assert_non_null(schema);
        assert_non_null(value);
        assert_int_equal(loom_schema_validate(schema, value, &msg),
                         LOOM_EINVALID);
        assert_non_null(msg);
        free(msg);
        json_decref(schema);
        json_decref(value);
        free(data);
        free(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_corpus),
        cmocka_unit_test(test_no_unknown_corpus),
        cmocka_unit_test(test_replay_crashes_found),
        cmocka_unit_test(test_tiny_inputs),
        cmocka_unit_test(test_openai_seeds_reach_their_paths),
        cmocka_unit_test(test_openai_cancel_checked),
        cmocka_unit_test(test_decoder_seeds_reach_their_paths),
        cmocka_unit_test(test_request_seeds_parse),
        cmocka_unit_test(test_config_seeds_load),
        cmocka_unit_test(test_schema_seeds_reject),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
