/*
 * Tests of loom's configuration (include/loom/config.h): a file using
 * every key, ${VAR} interpolation, every kind of error with the file, line
 * and key it must name, references between sections, the merge over the
 * environment, the providers the environment makes, model resolution,
 * the model settings routing needs (capabilities, reasoning controls,
 * exact prices, fallbacks, routing policies), and each limit (file size,
 * nesting, alias expansion, expanded text, fallbacks, price digits)
 * crossed. Every test starts from an environment without OPENAI_*,
 * ANTHROPIC_* or GEMINI_* so results do not depend on the machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/model_opts.h"
#include "loom/config.h"
#include "loom/router.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static int reset_env(void **state)
{
    (void)state;
    unsetenv("OPENAI_API_KEY");
    unsetenv("OPENAI_BASE_URL");
    unsetenv("ANTHROPIC_API_KEY");
    unsetenv("ANTHROPIC_BASE_URL");
    unsetenv("GEMINI_API_KEY");
    unsetenv("GEMINI_BASE_URL");
    unsetenv("LOOM_TEST_VAR");
    unsetenv("LOOM_TEST_EMPTY");
    unsetenv("LOOM_TEST_UNSET");
    unsetenv("LOOM_TEST_N");
    unsetenv("LOOM_TEST_BIG");
    unsetenv("LOOM_TEST_FULL_KEY");
    loom_error_clear();
    return 0;
}

/* Loads yaml as "t.yaml" and checks it fails with code and a message
 * containing every string of the NULL-terminated list. */
static void expect_fail(const char *yaml, int code, ...)
{
    loom_config *cfg = (loom_config *)0x1;
    const char *part;
    va_list ap;
    int rc;

    rc = loom_config_load_string(&cfg, yaml, "t.yaml");
    if (rc != code)
        print_error("rc %d, message: %s\n", rc, loom_error_last());
    assert_int_equal(rc, code);
    assert_null(cfg);
    va_start(ap, code);
    while ((part = va_arg(ap, const char *)) != NULL) {
        if (!strstr(loom_error_last(), part))
            print_error("'%s' not in: %s\n", part, loom_error_last());
        assert_non_null(strstr(loom_error_last(), part));
    }
    va_end(ap);
}

static loom_config *load_ok(const char *yaml)
{
    loom_config *cfg = NULL;
    int rc = loom_config_load_string(&cfg, yaml, "t.yaml");

    if (rc != 0)
        print_error("unexpected error: %s\n", loom_error_last());
    assert_int_equal(rc, 0);
    assert_non_null(cfg);
    return cfg;
}

/* A directory for files this test writes, under LOOM_TEST_TMP when set. */
static char *tmp_dir(void)
{
    const char *base = getenv("LOOM_TEST_TMP");
    char tmpl[4096];
    char *dir;

    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0700);
    snprintf(tmpl, sizeof(tmpl), "%s/loom-config-XXXXXX", base);
    dir = mkdtemp(tmpl);
    assert_non_null(dir);
    return strdup(dir);
}

static char *write_file(const char *dir, const char *name, const char *data,
                        size_t len)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    return strdup(path);
}

/* ---- a complete file ---------------------------------------------------- */

static void test_full_file(void **state)
{
    const char *path = LOOM_SOURCE_DIR "/tests/data/config/full.yaml";
    const loom_provider_config *p;
    const loom_agent_config *a;
    const loom_model_config *m;
    loom_model_config tmp;
    loom_config *cfg = NULL;
    json_t *t;

    (void)state;
    setenv("LOOM_TEST_FULL_KEY", "sk-full", 1);
    if (loom_config_load(&cfg, path) != 0)
        print_error("%s\n", loom_error_last());
    assert_non_null(cfg);
    assert_string_equal(cfg->path, path);
    assert_string_equal(cfg->log_level, "debug");
    assert_string_equal(cfg->log_format, "json");

    assert_int_equal(cfg->providers_len, 5);
    p = loom_config_provider(cfg, "openai");
    assert_non_null(p);
    assert_string_equal(p->name, "openai");
    assert_string_equal(p->kind, "openai");
    assert_string_equal(p->base_url, "https://api.example.com/v1");
    assert_string_equal(p->api_key, "sk-full");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Extra")),
        "extra value");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Count")), "3");
    assert_int_equal(p->connect_timeout_ms, 1500);
    assert_int_equal(p->first_byte_timeout_ms, 2500);
    assert_int_equal(p->idle_timeout_ms, 3500);
    assert_int_equal(p->answer_timeout_ms, 4500);
    assert_int_equal(p->max_retries, 4);
    assert_int_equal(p->retry_base_delay_ms, 100);
    assert_int_equal(p->retry_max_delay_ms, 900);

    p = loom_config_provider(cfg, "local");
    assert_non_null(p);
    assert_string_equal(p->kind, "openai");
    assert_string_equal(p->base_url, "http://127.0.0.1:11434/v1");
    assert_null(p->api_key);
    assert_int_equal(json_object_size(p->headers), 0);
    /* Defaults from the header. */
    assert_int_equal(p->connect_timeout_ms, 10000);
    assert_int_equal(p->first_byte_timeout_ms, 120000);
    assert_int_equal(p->idle_timeout_ms, 120000);
    assert_int_equal(p->answer_timeout_ms, 600000);
    assert_int_equal(p->max_retries, 2);
    assert_int_equal(p->retry_base_delay_ms, 500);
    assert_int_equal(p->retry_max_delay_ms, 30000);

    /* The other kinds; anthropic and openai-responses have default
     * base URLs. */
    p = loom_config_provider(cfg, "claude");
    assert_string_equal(p->kind, "anthropic");
    assert_string_equal(p->base_url, "https://api.anthropic.com");
    assert_string_equal(p->api_key, "sk-full");
    p = loom_config_provider(cfg, "gem");
    assert_string_equal(p->kind, "gemini");
    assert_string_equal(p->base_url, "http://127.0.0.1:9/gemini");
    p = loom_config_provider(cfg, "responses");
    assert_string_equal(p->kind, "openai-responses");
    assert_string_equal(p->base_url, "https://api.openai.com/v1");

    assert_int_equal(cfg->routing.retries, 1);
    assert_int_equal(cfg->routing.cooldown_ms, 5000);
    assert_int_equal(cfg->routing.failures_before_cooldown, 2);

    assert_int_equal(cfg->models_len, 3);
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "openai/gpt-4o-mini"), 0);
    assert_ptr_equal(m, &cfg->models[0]);
    assert_string_equal(m->provider, "openai");
    assert_string_equal(m->upstream, "gpt-4o-mini-2024-07-18");
    assert_int_equal(m->context_window, 128000);
    assert_int_equal(m->max_output_tokens, 16384);
    m = &cfg->models[1];
    assert_string_equal(m->name, "local/llama3");
    assert_string_equal(m->provider, "local");
    assert_string_equal(m->upstream, "llama3");
    assert_int_equal(m->context_window, 0);
    assert_int_equal(m->max_output_tokens, 0);
    /* Defaults of the routing settings. */
    assert_int_equal(m->capabilities.tools, 1);
    assert_int_equal(m->capabilities.parallel_tool_calls, 1);
    assert_int_equal(m->capabilities.reasoning, 0);
    assert_int_equal(m->capabilities.vision, 0);
    assert_null(m->reasoning_effort);
    assert_int_equal(m->thinking_budget, 0);
    assert_int_equal(m->prompt_cache, 0);
    assert_int_equal(m->chain_responses, 0);
    assert_int_equal(m->prices.set, 0);
    assert_int_equal(m->fallbacks_len, 0);
    assert_null(m->fallbacks);
    assert_int_equal(m->routing.retries, 1); /* the top-level policy */
    assert_int_equal(m->routing.cooldown_ms, 5000);
    assert_int_equal(m->routing.failures_before_cooldown, 2);

    m = &cfg->models[2];
    assert_string_equal(m->name, "claude/claude-sonnet-4-5");
    assert_string_equal(m->provider, "claude");
    assert_string_equal(m->upstream, "claude-sonnet-4-5-20250929");
    assert_int_equal(m->context_window, 200000);
    assert_int_equal(m->max_output_tokens, 64000);
    assert_int_equal(m->capabilities.tools, 1);
    assert_int_equal(m->capabilities.parallel_tool_calls, 0);
    assert_int_equal(m->capabilities.reasoning, 1);
    assert_int_equal(m->capabilities.vision, 1);
    assert_string_equal(m->reasoning_effort, "high");
    assert_int_equal(m->thinking_budget, 8000);
    assert_int_equal(m->prompt_cache, 1);
    assert_int_equal(m->chain_responses, 0);
    assert_int_equal(m->prices.set, 1);
    assert_int_equal(m->prices.input, 3000000);
    assert_int_equal(m->prices.cached_input, 300000);
    assert_int_equal(m->prices.cache_write, 3750000);
    assert_int_equal(m->prices.output, 15000000);
    assert_int_equal(m->prices.reasoning, 15000000);
    assert_int_equal(m->fallbacks_len, 2);
    assert_string_equal(m->fallbacks[0], "gem/gemini-2.5-pro");
    assert_string_equal(m->fallbacks[1], "local/llama3");
    /* Its own cooldown; the rest from the top-level policy. */
    assert_int_equal(m->routing.cooldown_ms, 60000);
    assert_int_equal(m->routing.retries, 1);
    assert_int_equal(m->routing.failures_before_cooldown, 2);

    assert_int_equal(cfg->agents_len, 2);
    a = loom_config_agent(cfg, "helper");
    assert_non_null(a);
    assert_string_equal(a->model, "openai/gpt-4o-mini");
    assert_string_equal(a->system_prompt, "You are helpful.\nBe brief.\n");
    assert_int_equal(a->tools_all, 0);
    assert_int_equal(a->tools_len, 2);
    assert_string_equal(a->tools[0], "get_time");
    assert_string_equal(a->tools[1], "web_search");
    assert_int_equal(a->max_iterations, 25);
    assert_int_equal(a->tool_choice.kind, LOOM_TOOL_CHOICE_FUNCTION);
    assert_string_equal(a->tool_choice.function, "get_time");
    assert_int_equal(a->parallel_tool_calls, 0);
    assert_int_equal(a->tool_concurrency, 3);

    a = loom_config_agent(cfg, "offline");
    assert_non_null(a);
    assert_string_equal(a->model, "local/qwen2.5");
    assert_null(a->system_prompt);
    assert_int_equal(a->tools_all, 0);
    assert_int_equal(a->tools_len, 0);
    assert_int_equal(a->tool_choice.kind, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(a->max_iterations, 10);
    assert_int_equal(a->parallel_tool_calls, 1);
    assert_int_equal(a->tool_concurrency, 8);
    assert_null(loom_config_agent(cfg, "nobody"));

    assert_string_equal(cfg->default_agent, "helper");

    t = json_object_get(cfg->tools, "get_time");
    assert_non_null(t);
    assert_string_equal(json_string_value(json_object_get(t, "default_"
                                                             "timezone")),
                        "Europe/Paris");
    assert_string_equal(json_string_value(json_object_get(t, "quoted")), "42");
    assert_true(json_is_integer(json_object_get(t, "number")));
    assert_int_equal(json_integer_value(json_object_get(t, "number")), 42);
    assert_true(json_is_real(json_object_get(t, "ratio")));
    assert_true(json_real_value(json_object_get(t, "ratio")) == 0.5);
    assert_true(json_is_true(json_object_get(t, "enabled")));
    assert_true(json_is_null(json_object_get(t, "nothing")));
    {
        json_t *want = json_loads("[1, \"two\", {\"three\": 3}]", 0, NULL);
        assert_true(json_equal(json_object_get(t, "list"), want));
        json_decref(want);
    }
    t = json_object_get(cfg->tools, "web_search");
    assert_true(json_is_object(t));
    assert_int_equal(json_object_size(t), 0);
    loom_config_free(cfg);
}

/* The loop's per-tool keys (docs/agents.md "Tool rules") are checked
 * where they are written, in `tools` and in an agent's `tool_options`;
 * the agent's keys go over the global ones, tool by tool. */
static void test_tool_rules(void **state)
{
    static const char head[] = "providers: {p: {base_url: 'http://h'}}\n";
    static const char good[] =
        "providers: {p: {base_url: 'http://h'}}\n"
        "agents:\n"
        "  a:\n"
        "    model: p/m\n"
        "    tools_disabled_message: 'Turn {tool} on'\n"
        "    tool_options:\n"
        "      chatbot: {history: full, own: 2}\n"
        "      rag: {wrap_result: '<ctx>{result}</ctx>'}\n"
        "tools:\n"
        "  chatbot:\n"
        "    then_force: {tool: rag, when: use_kb}\n"
        "    history: summary\n"
        "    own: 1\n"
        "  report:\n"
        "    default_args_on_bad_json: true\n"
        "    repair_arguments: {model: p/small}\n"
        "    then_force: chatbot\n";
    const loom_agent_config *a;
    json_t *merged = NULL, *want;
    loom_config *cfg;
    char yaml[512];

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg, good, "t.yaml"), 0);
    a = loom_config_agent(cfg, "a");
    assert_string_equal(a->tools_disabled_message, "Turn {tool} on");
    assert_int_equal(
        loom__tool_settings_merge(&merged, cfg->tools, a->tool_options), 0);
    want = json_loads("{\"chatbot\": {\"then_force\": {\"tool\": \"rag\", "
                      "\"when\": \"use_kb\"}, \"history\": \"full\", "
                      "\"own\": 2}, \"report\": "
                      "{\"default_args_on_bad_json\": true, "
                      "\"repair_arguments\": {\"model\": \"p/small\"}, "
                      "\"then_force\": \"chatbot\"}, \"rag\": "
                      "{\"wrap_result\": \"<ctx>{result}</ctx>\"}}",
                      0, NULL);
    assert_true(json_equal(merged, want));
    /* The global settings stay as the file gives them. */
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(cfg->tools, "chatbot"), "history")),
                        "summary");
    json_decref(want);
    json_decref(merged);
    /* Nothing to merge: the global object is used as it is. */
    assert_int_equal(loom__tool_settings_merge(&merged, cfg->tools, NULL), 0);
    assert_null(merged);
    loom_config_free(cfg);

    snprintf(yaml, sizeof(yaml), "%stools:\n  x:\n    history: some\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.history: must be full or summary", NULL);
    snprintf(yaml, sizeof(yaml),
             "%stools:\n  x:\n    default_args_on_bad_json: maybe\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.default_args_on_bad_json: must be true "
                "or false",
                NULL);
    snprintf(yaml, sizeof(yaml), "%stools:\n  x:\n    wrap_result: 'no'\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.wrap_result: must be a string holding "
                "{result}",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%stools:\n  x:\n    repair_arguments: {model: q/m}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.repair_arguments.model: ", NULL);
    snprintf(yaml, sizeof(yaml), "%stools:\n  x:\n    repair_arguments: p/m\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.repair_arguments: ", NULL);
    snprintf(yaml, sizeof(yaml),
             "%stools:\n  x:\n    then_force: {when: flag}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.then_force: missing required key 'tool'",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%stools:\n  x:\n    then_force: {tool: y, if: flag}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.then_force: unknown key 'if'", NULL);
    snprintf(yaml, sizeof(yaml), "%stools:\n  x:\n    then_force: [y]\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: tools.x.then_force: must be a tool name or "
                "{tool, when}",
                NULL);
    /* The same checks in an agent's tool_options. */
    snprintf(yaml, sizeof(yaml),
             "%sagents:\n  a:\n    model: p/m\n    tool_options:\n"
             "      x: {history: all}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: agents.a.tool_options.x.history: must be full or "
                "summary",
                NULL);
}

static void test_defaults_and_tools_all(void **state)
{
    loom_config *cfg;
    const loom_agent_config *a;

    (void)state;
    cfg = load_ok("providers:\n"
                  "  p: {base_url: 'http://h'}\n"
                  "agents:\n"
                  "  a: {model: p/m}\n");
    a = loom_config_agent(cfg, "a");
    assert_non_null(a);
    assert_int_equal(a->tools_all, 1);
    assert_null(a->tools);
    assert_int_equal(a->tools_len, 0);
    assert_int_equal(a->tool_choice.kind, LOOM_TOOL_CHOICE_AUTO);
    assert_null(a->tool_choice.function);
    assert_null(cfg->default_agent);
    assert_null(cfg->log_level);
    assert_null(cfg->log_format);
    assert_null(cfg->path);
    assert_true(json_is_object(cfg->tools));
    assert_int_equal(json_object_size(cfg->tools), 0);
    loom_config_free(cfg);
}

static void test_log_case(void **state)
{
    loom_config *cfg;

    (void)state;
    cfg = load_ok("log: {level: WARNING, format: JSON}\n");
    assert_string_equal(cfg->log_level, "warning");
    assert_string_equal(cfg->log_format, "json");
    loom_config_free(cfg);
}

static void test_empty_file(void **state)
{
    static const char *const texts[] = {"", "# only a comment\n", "~\n",
                                        "---\n", "\n\n"};
    char *dir = tmp_dir(), *path;
    loom_config *cfg;

    (void)state;
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        cfg = load_ok(texts[i]);
        assert_int_equal(cfg->providers_len, 0);
        assert_int_equal(cfg->models_len, 0);
        assert_int_equal(cfg->agents_len, 0);
        assert_null(cfg->default_agent);
        assert_int_equal(json_object_size(cfg->tools), 0);
        loom_config_free(cfg);
    }
    path = write_file(dir, "empty.yaml", "", 0);
    cfg = NULL;
    assert_int_equal(loom_config_load(&cfg, path), 0);
    assert_string_equal(cfg->path, path);
    assert_int_equal(cfg->providers_len, 0);
    loom_config_free(cfg);
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
}

/* ---- interpolation --------------------------------------------------------
 */

static void test_interpolation(void **state)
{
    loom_config *cfg;
    const loom_provider_config *p;
    const loom_agent_config *a;

    (void)state;
    setenv("LOOM_TEST_VAR", "secret", 1);
    setenv("LOOM_TEST_EMPTY", "", 1);
    setenv("LOOM_TEST_N", "42", 1);
    cfg = load_ok(
        "providers:\n"
        "  p:\n"
        "    base_url: http://${LOOM_TEST_UNSET:-127.0.0.1}:${LOOM_TEST_N}\n"
        "    api_key: ${LOOM_TEST_VAR}\n"
        "    headers:\n"
        "      Authorization: Bearer ${LOOM_TEST_VAR}!\n"
        "      X-Literal: '$${LOOM_TEST_VAR} costs $5 $$ ok'\n"
        "      X-Empty: \"[${LOOM_TEST_EMPTY}]\"\n"
        "      X-Empty-Default: ${LOOM_TEST_EMPTY:-fallback}\n"
        "      X-Empty-Default2: ${LOOM_TEST_UNSET:-}\n"
        "agents:\n"
        "  a:\n"
        "    model: p/${LOOM_TEST_VAR}\n"
        "    max_iterations: ${LOOM_TEST_N}\n"
        "    tool_concurrency: \"${LOOM_TEST_UNSET:-7}\"\n"
        "    parallel_tool_calls: ${LOOM_TEST_UNSET:-false}\n"
        "tools:\n"
        "  t:\n"
        "    n: '${LOOM_TEST_N}'\n"
        "    m: ${LOOM_TEST_N}\n");
    p = loom_config_provider(cfg, "p");
    assert_string_equal(p->base_url, "http://127.0.0.1:42");
    assert_string_equal(p->api_key, "secret");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "Authorization")),
        "Bearer secret!");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Literal")),
        "${LOOM_TEST_VAR} costs $5 $$ ok");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Empty")), "[]");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Empty-Default")),
        "fallback");
    assert_string_equal(
        json_string_value(json_object_get(p->headers, "X-Empty-Default2")), "");
    a = loom_config_agent(cfg, "a");
    assert_string_equal(a->model, "p/secret");
    assert_int_equal(a->max_iterations, 42);
    assert_int_equal(a->tool_concurrency, 7);
    assert_int_equal(a->parallel_tool_calls, 0);
    /* Interpolated before typing: a quoted value stays a string. */
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(cfg->tools, "t"), "n")),
                        "42");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(cfg->tools, "t"), "m")),
                     42);
    loom_config_free(cfg);
}

static void test_interpolation_errors(void **state)
{
    (void)state;
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://h\n"
                "    api_key: ${LOOM_TEST_UNSET}\n",
                LOOM_EINVALID, "t.yaml:4: ", "providers.p.api_key: ",
                "LOOM_TEST_UNSET is not set", NULL);
    expect_fail("log:\n  level: ${LOOM_TEST_VAR\n", LOOM_EINVALID,
                "t.yaml:2: log.level: ", "unterminated", NULL);
    expect_fail("log:\n  level: ${LOOM TEST}\n", LOOM_EINVALID,
                "t.yaml:2: log.level: ", "bad variable reference", NULL);
    expect_fail("log:\n  level: ${}\n", LOOM_EINVALID,
                "t.yaml:2:", "bad variable reference", NULL);
    expect_fail("log:\n  level: ${1ABC}\n", LOOM_EINVALID,
                "t.yaml:2:", "bad variable reference", NULL);
    expect_fail("log:\n  level: ${A:x}\n", LOOM_EINVALID,
                "t.yaml:2:", "bad variable reference", NULL);
    /* In free-form tool settings too. */
    expect_fail("tools:\n  t:\n    a: [x, '${LOOM_TEST_UNSET}']\n",
                LOOM_EINVALID,
                "t.yaml:3: tools.t.a[1]: ", "LOOM_TEST_UNSET is not set", NULL);
    /* Interpolated text is then typed: a bad number names the value. */
    setenv("LOOM_TEST_N", "ten", 1);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    max_iterations: ${LOOM_TEST_N}\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.max_iterations: ",
                "must be an integer from 1 to 1000, got 'ten'", NULL);
}

/* ---- syntax, unknown keys, types, ranges -------------------------------- */

static void test_syntax_errors(void **state)
{
    char *dir = tmp_dir(), *path;
    loom_config *cfg = NULL;
    const char *bad = "log:\n  level: info\n  format: [text\n";

    (void)state;
    expect_fail("log:\n  level: info\n   format: text\n", LOOM_EINVALID,
                "t.yaml:3: ", "mapping values are not allowed", NULL);
    expect_fail(bad, LOOM_EINVALID,
                "t.yaml:4: did not find expected ',' or ']' (while parsing a "
                "flow sequence started on line 3)",
                NULL);
    expect_fail("a: 1\n---\nb: 2\n", LOOM_EINVALID,
                "t.yaml:2: only one YAML document", NULL);
    expect_fail("log: {level: \"\\0\"}\n", LOOM_EINVALID,
                "t.yaml:1: log.level: must not contain NUL", NULL);
    expect_fail("log:\n  level: \x01\n", LOOM_EINVALID, "t.yaml:2: ", NULL);
    expect_fail("- a\n- b\n", LOOM_EINVALID,
                "t.yaml:1: the top level must be a mapping, got a list", NULL);
    /* From a file, the message names the path. */
    path = write_file(dir, "bad.yaml", bad, strlen(bad));
    assert_int_equal(loom_config_load(&cfg, path), LOOM_EINVALID);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), path));
    assert_non_null(strstr(loom_error_last(), "bad.yaml:4: "));
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
}

/* handoffs: defined agents other than itself, each a tool name; the
 * description is kept. */
static void test_handoffs(void **state)
{
    loom_config *cfg;
    const loom_agent_config *a;

    (void)state;
    cfg = load_ok("providers: {p: {base_url: 'http://h'}}\n"
                  "agents:\n"
                  "  triage: {model: p/m, handoffs: [billing, refunds]}\n"
                  "  billing: {model: p/m, description: Bills.,"
                  " handoffs: [triage]}\n"
                  "  refunds: {model: p/m}\n");
    a = loom_config_agent(cfg, "triage");
    assert_int_equal(a->handoffs_len, 2);
    assert_string_equal(a->handoffs[0], "billing");
    assert_string_equal(a->handoffs[1], "refunds");
    assert_null(a->description);
    a = loom_config_agent(cfg, "billing");
    assert_string_equal(a->description, "Bills.");
    assert_int_equal(loom_config_agent(cfg, "refunds")->handoffs_len, 0);
    loom_config_free(cfg);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  triage:\n"
                "    model: p/m\n"
                "    handoffs: [billing]\n",
                LOOM_EINVALID,
                "t.yaml:5: agents.triage.handoffs[0]: agent 'billing' is not "
                "defined under agents (agents: triage)",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  triage: {model: p/m, handoffs: [triage]}\n",
                LOOM_EINVALID,
                "t.yaml:3: agents.triage.handoffs[0]: an agent cannot hand "
                "off to itself",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a: {model: p/m, handoffs: [b, b]}\n"
                "  b: {model: p/m}\n",
                LOOM_EINVALID,
                "agents.a.handoffs[1]: agent 'b' is listed twice", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a: {model: p/m, handoffs: [b.c]}\n"
                "  b.c: {model: p/m}\n",
                LOOM_EINVALID,
                "agents.a.handoffs[0]: 'b.c' cannot be handed off to", NULL);
}

/* The research section: defaults, every key read, errors at their line,
 * the built-in research agents. */
static void test_research_section(void **state)
{
    loom_config *cfg = NULL;
    const loom_agent_config *a;

    (void)state;
    assert_int_equal(
        loom_config_load_string(
            &cfg, "providers: {p: {base_url: 'http://h'}}\n", "t.yaml"),
        0);
    assert_int_equal(cfg->research.max_cycles, 8);
    assert_int_equal(cfg->research.max_cycles_reasoning, 4);
    assert_int_equal(cfg->research.max_parallel_researchers, 5);
    assert_int_equal(cfg->research.researcher_max_searches, 3);
    assert_int_equal(cfg->research.report_max_tokens, 10000);
    assert_int_equal(cfg->research.time_limit_s, 1800);
    assert_int_equal(cfg->research.clarify, 1);
    assert_int_equal(cfg->research.min_context_tokens, 50000);
    a = loom_config_agent(cfg, "deep_research");
    assert_non_null(a);
    assert_true(a->research);
    a = loom_config_agent(cfg, "deep_research_researcher");
    assert_non_null(a);
    assert_false(a->research);
    assert_int_equal(a->tools_len, 2);
    loom_config_free(cfg);
    assert_int_equal(
        loom_config_load_string(&cfg,
                                "providers: {p: {base_url: 'http://h'}}\n"
                                "research:\n"
                                "  model: p/big\n"
                                "  researcher_model: p/small\n"
                                "  max_cycles: 6\n"
                                "  max_cycles_reasoning: 3\n"
                                "  max_parallel_researchers: 2\n"
                                "  researcher_max_searches: 4\n"
                                "  report_max_tokens: 2000\n"
                                "  time_limit_s: 60\n"
                                "  clarify: false\n"
                                "  min_context_tokens: 1000\n"
                                "  researcher_tools: [docs__search]\n"
                                "  max_cost_usd: 2.50\n"
                                "  max_tokens: 500000\n"
                                "agents:\n"
                                "  deep_research: {model: p/m, research: true, "
                                "max_iterations: 3}\n",
                                "t.yaml"),
        0);
    assert_string_equal(cfg->research.model, "p/big");
    assert_string_equal(cfg->research.researcher_model, "p/small");
    assert_int_equal(cfg->research.max_cycles, 6);
    assert_int_equal(cfg->research.max_cycles_reasoning, 3);
    assert_int_equal(cfg->research.max_parallel_researchers, 2);
    assert_int_equal(cfg->research.researcher_max_searches, 4);
    assert_int_equal(cfg->research.report_max_tokens, 2000);
    assert_int_equal(cfg->research.time_limit_s, 60);
    assert_int_equal(cfg->research.clarify, 0);
    assert_int_equal(cfg->research.min_context_tokens, 1000);
    assert_int_equal(cfg->research.researcher_tools_len, 1);
    assert_string_equal(cfg->research.researcher_tools[0], "docs__search");
    assert_int_equal(cfg->research.max_cost_micros, 2500000);
    assert_int_equal(cfg->research.max_tokens, 500000);
    /* The config's own agent replaces the built-in one. */
    assert_int_equal(loom_config_agent(cfg, "deep_research")->max_iterations,
                     3);
    loom_config_free(cfg);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "research:\n"
                "  max_cycles: 0\n",
                LOOM_EINVALID, "t.yaml:3: research.max_cycles: ", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "research:\n"
                "  max_cyles: 3\n",
                LOOM_EINVALID, "t.yaml:3: research: unknown key 'max_cyles'",
                NULL);
}

static void test_unknown_keys(void **state)
{
    (void)state;
    expect_fail(
        "providers: {p: {base_url: 'http://h'}}\n"
        "agents:\n"
        "  helper:\n"
        "    modle: p/m\n",
        LOOM_EINVALID, "t.yaml:4: agents.helper: ",
        "unknown key 'modle' (known: model, system_prompt, tools, "
        "max_iterations, tool_choice, parallel_tool_calls, "
        "tool_concurrency, planning, think, tool_timeout_ms, "
        "approval_timeout_ms, review, "
        "review_model, citations, memory, data_policy, limit_prompt, "
        "many_results_prompt, tool_descriptions, few_shot, description, "
        "handoffs, tool_options, tools_disabled_message, sub_agents, "
        "count_sub_agent_calls, max_depth, max_sub_runs, "
        "retry_without_tool_calls, model_after_retries, "
        "non_iterative_tools, research, max_cost_usd, max_tokens, "
        "max_seconds)",
        NULL);
    expect_fail(
        "log: {level: info}\nsrever: {port: 80}\n", LOOM_EINVALID,
        "t.yaml:2: unknown key 'srever' (known: log, providers, "
        "models, agents, default_agent, tools, server, routing, http_tools, "
        "mcp_servers, research, auth)",
        NULL);
    expect_fail("log: {level: info}\nserver: {port: 80}\n", LOOM_EINVALID,
                "t.yaml:2: server: unknown key 'port' (known: listen, db, ",
                NULL);
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://h\n"
                "    timeouts: {connect: 5}\n",
                LOOM_EINVALID, "t.yaml:4: providers.p.timeouts: ",
                "unknown key 'connect' (known: connect_ms, first_byte_ms, "
                "idle_ms, answer_ms)",
                NULL);
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://h\n"
                "    retries:\n"
                "      attempts: 1\n",
                LOOM_EINVALID,
                "t.yaml:5: providers.p.retries: ", "unknown key 'attempts'",
                NULL);
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://h\n"
                "    key: x\n",
                LOOM_EINVALID, "t.yaml:4: providers.p: unknown key 'key'",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "models:\n"
                "  p/m: {window: 5}\n",
                LOOM_EINVALID, "t.yaml:3: models.p/m: unknown key 'window'",
                NULL);
    expect_fail("log:\n  lvl: info\n", LOOM_EINVALID,
                "t.yaml:2: log: unknown key 'lvl' (known: level, format)",
                NULL);
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    expect_fail("log: {level: info}\nlog: {level: debug}\n", LOOM_EINVALID,
                "t.yaml:2: duplicate key 'log'", NULL);
    expect_fail("providers:\n"
                "  p: {base_url: 'http://a'}\n"
                "  p: {base_url: 'http://b'}\n",
                LOOM_EINVALID, "t.yaml:3: providers: duplicate key 'p'", NULL);
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://a\n"
                "    headers: {A: 1, A: 2}\n",
                LOOM_EINVALID, "t.yaml:4: providers.p.headers: duplicate",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    tools: [x, y, x]\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.tools[2]: ", "listed twice",
                NULL);
    expect_fail("tools:\n  t: {a: 1, b: 2, a: 3}\n", LOOM_EINVALID,
                "t.yaml:2: tools.t: duplicate key 'a'", NULL);
}

static void test_wrong_types(void **state)
{
    (void)state;
    expect_fail("providers:\n  - p\n", LOOM_EINVALID,
                "t.yaml:2: providers: must be a mapping, got a list", NULL);
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: [http://h]\n",
                LOOM_EINVALID,
                "t.yaml:3: providers.p.base_url: ", "must be a URL, got a list",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    max_iterations: {n: 1}\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.max_iterations: ",
                "must be an integer from 1 to 1000, got a mapping", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    tools: get_time\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.tools: ",
                "must be a list of tool names, got a scalar", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    tools: [{name: x}]\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.tools[0]: ",
                "must be a tool name, got a mapping", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    parallel_tool_calls: sometimes\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.parallel_tool_calls: ",
                "must be true or false, got 'sometimes'", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: p/m\n"
                "    tool_choice: [auto]\n",
                LOOM_EINVALID, "t.yaml:5: agents.a.tool_choice: ", "got a list",
                NULL);
    expect_fail("tools:\n  t: [1, 2]\n", LOOM_EINVALID,
                "t.yaml:2: tools.t: must be a mapping of settings, got a "
                "list",
                NULL);
    expect_fail("agents: 5\n", LOOM_EINVALID,
                "t.yaml:1: agents: must be a mapping, got a scalar", NULL);
    expect_fail("providers:\n  [a]: {base_url: 'http://h'}\n", LOOM_EINVALID,
                "t.yaml:2: providers: keys must be strings", NULL);
    expect_fail("default_agent: [a]\n", LOOM_EINVALID,
                "t.yaml:1: default_agent: must be an agent name, got a list",
                NULL);
}

/* Base URLs are checked with libcurl's parser: what it refuses (a bad
 * port, no host) is refused, and so are the one-slash and three-slash
 * forms it would take. */
/* An agent's data_policy: absent or zero stores everything; each key
 * read, and its wrong types and unknown keys reported at their line. */
/* An agent's budget keys: dollars read exactly into micro-dollars, the
 * others as integers; absent keys are no limit; bad values fail at their
 * line. */
static void test_agent_budget(void **state)
{
    static const char ok[] = "providers: {p: {base_url: 'http://h'}}\n"
                             "agents:\n"
                             "  main:\n"
                             "    model: p/m\n"
                             "    max_cost_usd: 0.015\n"
                             "    max_tokens: 5000\n"
                             "    max_seconds: 30\n"
                             "  other: {model: p/m}\n";
    loom_config *cfg;
    const loom_agent_config *m, *o;

    (void)state;
    cfg = load_ok(ok);
    m = loom_config_agent(cfg, "main");
    o = loom_config_agent(cfg, "other");
    assert_int_equal(m->budget_cost_micros, 15000);
    assert_int_equal(m->budget_tokens, 5000);
    assert_int_equal(m->budget_seconds, 30);
    assert_int_equal(o->budget_cost_micros, 0);
    assert_int_equal(o->budget_tokens, 0);
    assert_int_equal(o->budget_seconds, 0);
    loom_config_free(cfg);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  main: {model: p/m, max_cost_usd: -1}\n",
                LOOM_EINVALID, "t.yaml:3: agents.main.max_cost_usd: ", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  main: {model: p/m, max_seconds: 0}\n",
                LOOM_EINVALID, "t.yaml:3: agents.main.max_seconds: ", NULL);
}

/* sub_agents name agents of the config, in any order, the agent itself
 * included; the limits have defaults and ranges. */
static void test_sub_agents(void **state)
{
    static const char ok[] = "providers: {p: {base_url: 'http://h'}}\n"
                             "agents:\n"
                             "  main:\n"
                             "    model: p/m\n"
                             "    sub_agents: [researcher, main]\n"
                             "    count_sub_agent_calls: false\n"
                             "    max_depth: 2\n"
                             "    max_sub_runs: 7\n"
                             "  researcher:\n"
                             "    model: p/m\n"
                             "    description: Finds sources.\n";
    loom_config *cfg;
    const loom_agent_config *m, *r;

    (void)state;
    cfg = load_ok(ok);
    m = loom_config_agent(cfg, "main");
    r = loom_config_agent(cfg, "researcher");
    assert_int_equal(m->sub_agents_len, 2);
    assert_string_equal(m->sub_agents[0], "researcher");
    assert_string_equal(m->sub_agents[1], "main");
    assert_int_equal(m->sub_agents_lines[0], 5);
    assert_false(m->count_sub_agent_calls);
    assert_int_equal(m->max_depth, 2);
    assert_int_equal(m->max_sub_runs, 7);
    assert_null(m->description);
    assert_string_equal(r->description, "Finds sources.");
    assert_true(r->count_sub_agent_calls);
    assert_int_equal(r->max_depth, 3);
    assert_int_equal(r->max_sub_runs, 50);
    assert_int_equal(r->sub_agents_len, 0);
    loom_config_free(cfg);

    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  main:\n"
                "    model: p/m\n"
                "    sub_agents:\n"
                "      - helper\n"
                "      - nobody\n"
                "  helper: {model: p/m}\n",
                LOOM_EINVALID, "t.yaml:7: agents.main.sub_agents[1]: ",
                "agent 'nobody' is not defined under agents (agents: main, "
                "helper)",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  main: {model: p/m, sub_agents: [main, main]}\n",
                LOOM_EINVALID,
                "agents.main.sub_agents[1]: ", "agent 'main' is listed twice",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  main: {model: p/m, max_depth: 0}\n",
                LOOM_EINVALID,
                "agents.main.max_depth: ", "must be an integer from 1 to 16",
                NULL);
}

static void test_data_policy(void **state)
{
    static const char head[] = "providers: {p: {base_url: 'http://h'}}\n"
                               "agents:\n"
                               "  a:\n"
                               "    model: p/m\n";
    char yaml[512];
    loom_config *cfg;
    const loom_agent_data_policy *dp;

    (void)state;
    cfg = load_ok(head);
    dp = &cfg->agents[0].data_policy;
    assert_false(dp->omit_text || dp->omit_tool_calls ||
                 dp->omit_tool_results || dp->tools_set);
    loom_config_free(cfg);

    snprintf(yaml, sizeof(yaml),
             "%s    data_policy:\n"
             "      store_text: false\n"
             "      store_tool_calls: yes\n"
             "      store_tool_results: off\n"
             "      tools: [get_time, web_search]\n",
             head);
    cfg = load_ok(yaml);
    dp = &cfg->agents[0].data_policy;
    assert_true(dp->omit_text);
    assert_false(dp->omit_tool_calls);
    assert_true(dp->omit_tool_results);
    assert_true(dp->tools_set);
    assert_int_equal(dp->tools_len, 2);
    assert_string_equal(dp->tools[0], "get_time");
    assert_string_equal(dp->tools[1], "web_search");
    loom_config_free(cfg);

    /* An empty list stores no tool; null keys are as if absent. */
    snprintf(yaml, sizeof(yaml),
             "%s    data_policy: {tools: [], store_text: null}\n", head);
    cfg = load_ok(yaml);
    dp = &cfg->agents[0].data_policy;
    assert_true(dp->tools_set);
    assert_int_equal(dp->tools_len, 0);
    assert_false(dp->omit_text);
    loom_config_free(cfg);

    snprintf(yaml, sizeof(yaml), "%s    data_policy:\n      store_text: 2\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: agents.a.data_policy.store_text: ",
                "must be true or false, got '2'", NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    data_policy:\n      store_tool_calls: [true]\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: agents.a.data_policy.store_tool_calls: ",
                "got a list", NULL);
    snprintf(yaml, sizeof(yaml), "%s    data_policy:\n      tools: get_time\n",
             head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:6: agents.a.data_policy.tools: ",
                "must be a list of tool names, got a scalar", NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    data_policy:\n      tools: [a, 'b c', a]\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:6: agents.a.data_policy.tools",
                "tool 'a' is listed twice", NULL);
    snprintf(yaml, sizeof(yaml), "%s    data_policy: true\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:5: agents.a.data_policy: ",
                "must be a mapping, got a scalar", NULL);
    snprintf(yaml, sizeof(yaml), "%s    data_policy:\n      store_txt: false\n",
             head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:6: agents.a.data_policy: ",
                "unknown key 'store_txt' (known: store_text, store_tool_calls, "
                "store_tool_results, tools)",
                NULL);
}

static void test_url_forms(void **state)
{
    static const char *const good[] = {"http://h", "HTTPS://h/v1//",
                                       "http://[::1]:8080/v1",
                                       "http://u:p@h:0/x?y#z", NULL};
    static const char *const bad[] = {
        "http:/h",      "http:///h", "http://", "http://:80", "http://h:99999",
        "http://h/a b", "h:80",      "ftp://h", NULL};
    char yaml[256];

    (void)state;
    for (size_t i = 0; good[i]; i++) {
        snprintf(yaml, sizeof(yaml), "providers:\n  p:\n    base_url: '%s'\n",
                 good[i]);
        loom_config_free(load_ok(yaml));
    }
    for (size_t i = 0; bad[i]; i++) {
        snprintf(yaml, sizeof(yaml), "providers:\n  p:\n    base_url: '%s'\n",
                 bad[i]);
        expect_fail(yaml, LOOM_EINVALID,
                    "t.yaml:3: providers.p.base_url: must be an http:// or "
                    "https:// URL",
                    NULL);
    }
}

static void test_bad_values(void **state)
{
    (void)state;
    expect_fail("log: {level: loud}\n", LOOM_EINVALID,
                "t.yaml:1: log.level: must be debug, info, warn, error or "
                "off, got 'loud'",
                NULL);
    expect_fail("log:\n  format: xml\n", LOOM_EINVALID,
                "t.yaml:2: log.format: must be text or json, got 'xml'", NULL);
    expect_fail("providers:\n  p:\n    kind: anthropic-v2\n"
                "    base_url: http://h\n",
                LOOM_EINVALID,
                "t.yaml:3: providers.p.kind: must be one of: openai, "
                "openai-responses, anthropic, gemini, got 'anthropic-v2'",
                NULL);
    expect_fail("providers:\n  p:\n    api_key: k\n", LOOM_EINVALID,
                "t.yaml:2: providers.p: missing required key 'base_url' "
                "(kind openai)",
                NULL);
    expect_fail("providers:\n  p:\n", LOOM_EINVALID,
                "t.yaml:2: providers.p: missing required key 'base_url'", NULL);
    expect_fail("providers:\n  p:\n    base_url: ftp://h\n", LOOM_EINVALID,
                "t.yaml:3: providers.p.base_url: must be an http:// or "
                "https:// URL, got 'ftp://h'",
                NULL);
    expect_fail("providers:\n  p:\n    base_url: http://h\n"
                "    headers:\n      'Bad Name': x\n",
                LOOM_EINVALID,
                "t.yaml:5: providers.p.headers: 'Bad Name' is not a valid "
                "HTTP header name",
                NULL);
    expect_fail("providers:\n  p:\n    base_url: http://h\n"
                "    headers:\n      X-A: \"a\\r\\nX-Evil: 1\"\n",
                LOOM_EINVALID,
                "t.yaml:5: providers.p.headers.X-A: header values must not "
                "contain line breaks",
                NULL);
    expect_fail("providers:\n  'a/b': {base_url: 'http://h'}\n", LOOM_EINVALID,
                "t.yaml:2: providers: 'a/b' is not a valid provider name",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  'a b': {model: p/m}\n",
                LOOM_EINVALID,
                "t.yaml:3: agents: 'a b' is not a valid agent name", NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  a:\n    model: p/m\n    tools: ['get time']\n",
                LOOM_EINVALID,
                "t.yaml:5: agents.a.tools[0]: 'get time' is not a valid "
                "tool name",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  a:\n    model: p/m\n    tool_choice: 'no way'\n",
                LOOM_EINVALID,
                "t.yaml:5: agents.a.tool_choice: must be auto, none, "
                "required or a tool name, got 'no way'",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "models:\n  p/m:\n    upstream: ''\n",
                LOOM_EINVALID,
                "t.yaml:4: models.p/m.upstream: must not be "
                "empty",
                NULL);
    expect_fail("tools:\n  'a.b': {}\n", LOOM_EINVALID,
                "t.yaml:2: tools: 'a.b' is not a valid tool name", NULL);
}

/* A range case: the field's line is "    <pre><value><post>" after head. */
typedef struct {
    const char *head, *pre, *post, *key, *range;
    const char *lo, *hi, *below, *above;
} range_case;

static void check_range(const range_case *c, const char *value, int ok)
{
    char yaml[1024], want[256], got[128];

    snprintf(yaml, sizeof(yaml), "%s    %s%s%s\n", c->head, c->pre, value,
             c->post);
    if (ok) {
        loom_config_free(load_ok(yaml));
        return;
    }
    snprintf(want, sizeof(want), "%s: must be an integer from %s", c->key,
             c->range);
    snprintf(got, sizeof(got), "got '%s'", value);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:", want,
                value[0] == '\'' ? "got ' 5'" : got, NULL);
}

static void test_ranges(void **state)
{
    static const char agent[] = "providers: {p: {base_url: 'http://h'}}\n"
                                "agents:\n"
                                "  a:\n"
                                "    model: p/m\n";
    static const char prov[] = "providers:\n"
                               "  p:\n"
                               "    base_url: http://h\n";
    static const char model[] = "providers: {p: {base_url: 'http://h'}}\n"
                                "models:\n"
                                "  p/m:\n";
    static const char reasoning[] = "providers: {p: {base_url: 'http://h'}}\n"
                                    "models:\n"
                                    "  p/m:\n"
                                    "    capabilities: {reasoning: true}\n";
    static const range_case cases[] = {
        {"", "routing: {retries: ", "}", "routing.retries", "0 to 10", "0",
         "10", "-1", "11"},
        {"", "routing: {cooldown_ms: ", "}", "routing.cooldown_ms",
         "0 to 3600000", "0", "3600000", "-1", "3600001"},
        {"", "routing: {failures_before_cooldown: ", "}",
         "routing.failures_before_cooldown", "1 to 1000", "1", "1000", "0",
         "1001"},
        {model, "routing: {retries: ", "}", "models.p/m.routing.retries",
         "0 to 10", "0", "10", "-1", "11"},
        {model, "routing: {cooldown_ms: ", "}",
         "models.p/m.routing.cooldown_ms", "0 to 3600000", "0", "3600000", "-1",
         "3600001"},
        {model, "routing: {failures_before_cooldown: ", "}",
         "models.p/m.routing.failures_before_cooldown", "1 to 1000", "1",
         "1000", "0", "1001"},
        {reasoning, "reasoning: {thinking_budget: ", "}",
         "models.p/m.reasoning.thinking_budget", "1 to 1000000000", "1",
         "1000000000", "0", "1000000001"},
        {agent, "max_iterations: ", "", "agents.a.max_iterations", "1 to 1000",
         "1", "1000", "0", "1001"},
        {agent, "tool_concurrency: ", "", "agents.a.tool_concurrency",
         "1 to 64", "1", "64", "0", "65"},
        {prov, "timeouts: {connect_ms: ", "}",
         "providers.p.timeouts.connect_ms", "1 to 3600000", "1", "3600000", "0",
         "3600001"},
        {prov, "timeouts: {first_byte_ms: ", "}",
         "providers.p.timeouts.first_byte_ms", "1 to 3600000", "1", "3600000",
         "-5", "99999999999999999999"},
        {prov, "timeouts: {idle_ms: ", "}", "providers.p.timeouts.idle_ms",
         "1 to 3600000", "1", "3600000", "0", "3600001"},
        {prov, "timeouts: {answer_ms: ", "}", "providers.p.timeouts.answer_ms",
         "1 to 3600000", "1", "3600000", "0", "3600001"},
        {prov, "retries: {max: ", "}", "providers.p.retries.max", "0 to 10",
         "0", "10", "-1", "11"},
        {prov, "retries: {max_delay_ms: 3600000, base_delay_ms: ", "}",
         "providers.p.retries.base_delay_ms", "0 to 3600000", "0", "3600000",
         "-1", "3600001"},
        {prov, "retries: {base_delay_ms: 0, max_delay_ms: ", "}",
         "providers.p.retries.max_delay_ms", "0 to 3600000", "0", "3600000",
         "-1", "3600001"},
        {model, "context_window: ", "", "models.p/m.context_window",
         "0 to 1000000000", "0", "1000000000", "-1", "1000000001"},
        {model, "max_output_tokens: ", "", "models.p/m.max_output_tokens",
         "0 to 1000000000", "0", "1000000000", "-1", "1000000001"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const range_case *c = &cases[i];

        check_range(c, c->lo, 1);
        check_range(c, c->hi, 1);
        check_range(c, c->below, 0);
        check_range(c, c->above, 0);
        check_range(c, "ten", 0);
        check_range(c, "1.5", 0);
        check_range(c, "0x10", 0);
        check_range(c, "' 5'", 0);
    }
    expect_fail("providers:\n"
                "  p:\n"
                "    base_url: http://h\n"
                "    retries:\n"
                "      base_delay_ms: 1000\n"
                "      max_delay_ms: 999\n",
                LOOM_EINVALID, "t.yaml:6: providers.p.retries.max_delay_ms: ",
                "must be at least base_delay_ms (1000), got 999", NULL);
    {
        /* Without max_delay_ms, a long base delay raises the cap. */
        loom_config *cfg = load_ok("providers:\n"
                                   "  p:\n"
                                   "    base_url: http://h\n"
                                   "    retries: {base_delay_ms: 60000}\n");
        assert_int_equal(cfg->providers[0].retry_base_delay_ms, 60000);
        assert_int_equal(cfg->providers[0].retry_max_delay_ms, 60000);
        loom_config_free(cfg);
    }
}

/* ---- server section -------------------------------------------------- */

static void test_server_section(void **state)
{
    static const char head[] = "server:\n";
    static const range_case cases[] = {
        {head, "max_body_bytes: ", "", "server.max_body_bytes",
         "1024 to 1073741824", "1024", "1073741824", "1023", "1073741825"},
        {head, "max_concurrent_runs: ", "", "server.max_concurrent_runs",
         "1 to 100000", "1", "100000", "0", "100001"},
        {head, "max_connections: ", "", "server.max_connections",
         "1 to 1000000", "1", "1000000", "0", "1000001"},
        {head, "max_connections_per_address: ", "",
         "server.max_connections_per_address", "0 to 1000000", "0", "1000000",
         "-1", "1000001"},
        {head, "header_timeout_ms: ", "", "server.header_timeout_ms",
         "1000 to 3600000", "1000", "3600000", "999", "3600001"},
        {head, "connection_memory_kb: ", "", "server.connection_memory_kb",
         "16 to 1024", "16", "1024", "15", "1025"},
        {head, "queue_max: ", "", "server.queue_max", "0 to 1000000", "0",
         "1000000", "-1", "1000001"},
        {head, "queue_max_per_identity: ", "", "server.queue_max_per_identity",
         "0 to 1000000", "0", "1000000", "-1", "1000001"},
        {head, "queue_wait_ms: ", "", "server.queue_wait_ms", "0 to 3600000",
         "0", "3600000", "-1", "3600001"},
        {head, "keepalive_ms: ", "", "server.keepalive_ms", "10 to 3600000",
         "10", "3600000", "9", "3600001"},
        {head, "read_timeout_ms: ", "", "server.read_timeout_ms",
         "1000 to 3600000", "1000", "3600000", "999", "3600001"},
        {head, "shutdown_grace_ms: ", "", "server.shutdown_grace_ms",
         "0 to 3600000", "0", "3600000", "-1", "3600001"},
        {head, "keep_finished_runs: ", "", "server.keep_finished_runs",
         "0 to 1000000", "0", "1000000", "-1", "1000001"},
        {head, "max_run_events_bytes: ", "", "server.max_run_events_bytes",
         "4096 to 4294967296", "4096", "4294967296", "4095", "4294967297"},
        {head, "workers: ", "", "server.workers", "0 to 4096", "0", "4096",
         "-1", "4097"},
        {head, "tool_threads: ", "", "server.tool_threads", "1 to 100000", "1",
         "100000", "0", "100001"},
        {head, "fiber_stack_kb: ", "", "server.fiber_stack_kb", "256 to 65536",
         "256", "65536", "255", "65537"},
    };
    loom_config *cfg;

    (void)state;
    /* Defaults, with no file and with a file that does not mention it. */
    cfg = load_ok("log: {level: info}\n");
    assert_string_equal(cfg->server.listen, "127.0.0.1:8080");
    assert_string_equal(cfg->server.db, "./data/loom.db");
    assert_int_equal(cfg->server.max_body_bytes, 4 << 20);
    assert_int_equal(cfg->server.max_concurrent_runs, 64);
    assert_int_equal(cfg->server.max_connections, 32768);
    assert_int_equal(cfg->server.max_connections_per_address, 1024);
    assert_int_equal(cfg->server.header_timeout_ms, 10000);
    assert_int_equal(cfg->server.connection_memory_kb, 32);
    assert_int_equal(cfg->server.queue_max, 256);
    assert_int_equal(cfg->server.queue_max_per_identity, 0);
    assert_int_equal(cfg->server.queue_wait_ms, 10000);
    assert_int_equal(cfg->server.keepalive_ms, 15000);
    assert_int_equal(cfg->server.read_timeout_ms, 30000);
    assert_int_equal(cfg->server.shutdown_grace_ms, 10000);
    assert_int_equal(cfg->server.keep_finished_runs, 1000);
    assert_int_equal(cfg->server.max_run_events_bytes, 64L << 20);
    assert_int_equal(cfg->server.ui, 1);
    loom_config_free(cfg);
    cfg = load_ok("server: {ui: false}\n");
    assert_int_equal(cfg->server.ui, 0);
    loom_config_free(cfg);
    /* The worker pool: on by default, its sizes, and off. */
    cfg = load_ok("log: {level: info}\n");
    assert_int_equal(cfg->server.fibers, 1);
    assert_int_equal(cfg->server.workers, 0);
    assert_int_equal(cfg->server.tool_threads, 64);
    assert_int_equal(cfg->server.fiber_stack_kb, 256);
    loom_config_free(cfg);
    cfg = load_ok("server: {fibers: false, workers: 3, tool_threads: 5}\n");
    assert_int_equal(cfg->server.fibers, 0);
    assert_int_equal(cfg->server.workers, 3);
    assert_int_equal(cfg->server.tool_threads, 5);
    loom_config_free(cfg);

    setenv("LOOM_TEST_PORT", "9090", 1);
    cfg = load_ok("server:\n"
                  "  listen: 0.0.0.0:${LOOM_TEST_PORT}\n"
                  "  db: /var/lib/loom/x.db\n"
                  "  max_body_bytes: 2048\n"
                  "  max_concurrent_runs: 3\n"
                  "  max_connections: 10\n"
                  "  max_connections_per_address: 3\n"
                  "  header_timeout_ms: 1500\n"
                  "  connection_memory_kb: 48\n"
                  "  queue_max: 7\n"
                  "  queue_max_per_identity: 2\n"
                  "  queue_wait_ms: 0\n"
                  "  keepalive_ms: 50\n"
                  "  read_timeout_ms: 2000\n"
                  "  shutdown_grace_ms: 0\n"
                  "  keep_finished_runs: 0\n"
                  "  max_run_events_bytes: 8192\n");
    unsetenv("LOOM_TEST_PORT");
    assert_string_equal(cfg->server.listen, "0.0.0.0:9090");
    assert_string_equal(cfg->server.db, "/var/lib/loom/x.db");
    assert_int_equal(cfg->server.max_body_bytes, 2048);
    assert_int_equal(cfg->server.max_concurrent_runs, 3);
    assert_int_equal(cfg->server.max_connections, 10);
    assert_int_equal(cfg->server.max_connections_per_address, 3);
    assert_int_equal(cfg->server.header_timeout_ms, 1500);
    assert_int_equal(cfg->server.connection_memory_kb, 48);
    assert_int_equal(cfg->server.queue_max, 7);
    assert_int_equal(cfg->server.queue_max_per_identity, 2);
    assert_int_equal(cfg->server.queue_wait_ms, 0);
    assert_int_equal(cfg->server.keepalive_ms, 50);
    assert_int_equal(cfg->server.read_timeout_ms, 2000);
    assert_int_equal(cfg->server.shutdown_grace_ms, 0);
    assert_int_equal(cfg->server.keep_finished_runs, 0);
    assert_int_equal(cfg->server.max_run_events_bytes, 8192);
    loom_config_free(cfg);

    /* An IPv6 address keeps its brackets; port 0 is allowed. */
    cfg = load_ok("server: {listen: '[::1]:0'}\n");
    assert_string_equal(cfg->server.listen, "[::1]:0");
    loom_config_free(cfg);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        check_range(&cases[i], cases[i].lo, 1);
        check_range(&cases[i], cases[i].hi, 1);
        check_range(&cases[i], cases[i].below, 0);
        check_range(&cases[i], cases[i].above, 0);
        check_range(&cases[i], "ten", 0);
    }
    expect_fail("server:\n  listen: localhost\n", LOOM_EINVALID,
                "t.yaml:2: server.listen: must be HOST:PORT (port 0..65535), "
                "got 'localhost'",
                NULL);
    expect_fail("server:\n  listen: 'h:65536'\n", LOOM_EINVALID,
                "t.yaml:2: server.listen: must be HOST:PORT", NULL);
    expect_fail("server:\n  listen: ':80'\n", LOOM_EINVALID,
                "server.listen: must be HOST:PORT", NULL);
    expect_fail("server:\n  listen: 'h:8x'\n", LOOM_EINVALID,
                "server.listen: must be HOST:PORT", NULL);
    expect_fail("server:\n  db: ''\n", LOOM_EINVALID,
                "t.yaml:2: server.db: must not be empty", NULL);
    expect_fail("server:\n  max_body: 5\n", LOOM_EINVALID,
                "t.yaml:2: server: unknown key 'max_body'", NULL);
    expect_fail("server: [a]\n", LOOM_EINVALID,
                "t.yaml:1: server: must be a mapping", NULL);
    expect_fail("server:\n  listen: [a]\n", LOOM_EINVALID,
                "t.yaml:2: server.listen: must be HOST:PORT, got a list",
                NULL);
}

/* ---- references -----------------------------------------------------------
 */

static void test_references(void **state)
{
    loom_config *cfg;

    (void)state;
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n"
                "  a:\n"
                "    model: q/m\n",
                LOOM_EINVALID, "t.yaml:4: agents.a.model: ",
                "model 'q/m' is not listed under models and its provider "
                "'q' is not defined (providers: p)",
                NULL);
    expect_fail("agents:\n  a:\n    model: gpt-4o\n", LOOM_EINVALID,
                "t.yaml:3: agents.a.model: ",
                "model 'gpt-4o' is not listed under models and is not of "
                "the form provider/model",
                NULL);
    expect_fail("agents:\n  a:\n    system_prompt: hi\n", LOOM_EINVALID,
                "t.yaml:2: agents.a: missing required key 'model'", NULL);
    expect_fail("models:\n  x/m: {}\n", LOOM_EINVALID,
                "t.yaml:2: models.x/m: provider 'x' is not defined "
                "(providers: none)",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "models:\n  justaname: {}\n",
                LOOM_EINVALID,
                "t.yaml:3: models: 'justaname' is not of the form "
                "provider/model",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  a: {model: p/m}\n"
                "default_agent: b\n",
                LOOM_EINVALID,
                "t.yaml:4: default_agent: agent 'b' is not defined under "
                "agents (agents: a)",
                NULL);
    expect_fail("default_agent: b\n", LOOM_EINVALID,
                "t.yaml:1: default_agent: agent 'b' is not defined under "
                "agents (agents: none)",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  a:\n    model: p/m\n    tools: [x]\n"
                "    tool_choice: y\n",
                LOOM_EINVALID,
                "t.yaml:6: agents.a.tool_choice: tool 'y' is not in this "
                "agent's tools",
                NULL);
    expect_fail("providers: {p: {base_url: 'http://h'}}\n"
                "agents:\n  a:\n    model: p/m\n    tools: []\n"
                "    tool_choice: required\n",
                LOOM_EINVALID, "t.yaml:6: agents.a.tool_choice: ",
                "'required' needs at least one tool", NULL);
    /* Sections may come in any order in the file. */
    cfg = load_ok("default_agent: a\n"
                  "agents:\n  a: {model: p/listed, tool_choice: required}\n"
                  "models:\n  p/listed: {upstream: real}\n"
                  "providers: {p: {base_url: 'http://h'}}\n");
    assert_string_equal(cfg->default_agent, "a");
    assert_int_equal(loom_config_agent(cfg, "a")->tool_choice.kind,
                     LOOM_TOOL_CHOICE_REQUIRED);
    loom_config_free(cfg);
}

/* ---- the environment ------------------------------------------------------
 */

static void test_from_env(void **state)
{
    loom_config *cfg = NULL;
    const loom_provider_config *p;

    (void)state;
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 0);
    assert_null(cfg->path);
    assert_true(json_is_object(cfg->tools));
    loom_config_free(cfg);

    setenv("OPENAI_API_KEY", "sk-env", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    /* One key, both OpenAI wire formats. */
    assert_int_equal(cfg->providers_len, 2);
    p = loom_config_provider(cfg, "openai-responses");
    assert_non_null(p);
    assert_string_equal(p->kind, "openai-responses");
    assert_string_equal(p->base_url, "https://api.openai.com/v1");
    assert_string_equal(p->api_key, "sk-env");
    p = loom_config_provider(cfg, "openai");
    assert_non_null(p);
    assert_string_equal(p->kind, "openai");
    assert_string_equal(p->base_url, "https://api.openai.com/v1");
    assert_string_equal(p->api_key, "sk-env");
    assert_int_equal(json_object_size(p->headers), 0);
    assert_int_equal(p->connect_timeout_ms, 10000);
    assert_int_equal(p->first_byte_timeout_ms, 120000);
    assert_int_equal(p->idle_timeout_ms, 120000);
    assert_int_equal(p->answer_timeout_ms, 600000);
    assert_int_equal(p->max_retries, 2);
    assert_int_equal(p->retry_base_delay_ms, 500);
    assert_int_equal(p->retry_max_delay_ms, 30000);
    assert_int_equal(cfg->models_len, 0);
    assert_int_equal(cfg->agents_len, 0);
    assert_null(cfg->default_agent);
    loom_config_free(cfg);

    setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1//", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_string_equal(loom_config_provider(cfg, "openai")->base_url,
                        "http://127.0.0.1:8080/v1");
    assert_string_equal(
        loom_config_provider(cfg, "openai-responses")->base_url,
        "http://127.0.0.1:8080/v1");
    loom_config_free(cfg);

    /* A base URL alone is enough: local servers need no key. */
    unsetenv("OPENAI_API_KEY");
    assert_int_equal(loom_config_from_env(&cfg), 0);
    p = loom_config_provider(cfg, "openai");
    assert_non_null(p);
    assert_null(p->api_key);
    loom_config_free(cfg);

    /* Empty counts as unset. */
    setenv("OPENAI_BASE_URL", "", 1);
    setenv("OPENAI_API_KEY", "", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 0);
    loom_config_free(cfg);

    setenv("OPENAI_BASE_URL", "localhost:11434", 1);
    cfg = (loom_config *)0x1;
    assert_int_equal(loom_config_from_env(&cfg), LOOM_EINVALID);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), "OPENAI_BASE_URL"));
    /* And a file load reports it too. */
    expect_fail("", LOOM_EINVALID, "OPENAI_BASE_URL", NULL);
}

static void test_merge_over_env(void **state)
{
    loom_config *cfg;
    const loom_provider_config *p;

    (void)state;
    setenv("OPENAI_API_KEY", "sk-env", 1);
    /* The environment's provider serves the file's agents. */
    cfg = load_ok("agents:\n  a: {model: openai/gpt-4o-mini}\n"
                  "providers: {local: {base_url: 'http://127.0.0.1:1/v1'}}\n");
    assert_int_equal(cfg->providers_len, 3);
    p = loom_config_provider(cfg, "openai");
    assert_string_equal(p->api_key, "sk-env");
    assert_string_equal(p->base_url, "https://api.openai.com/v1");
    assert_non_null(loom_config_provider(cfg, "local"));
    loom_config_free(cfg);

    /* A file provider of the same name replaces it entirely. */
    cfg = load_ok("providers:\n"
                  "  openai:\n"
                  "    base_url: https://proxy.example/v1\n"
                  "    timeouts: {connect_ms: 5}\n");
    assert_int_equal(cfg->providers_len, 2);
    p = loom_config_provider(cfg, "openai");
    assert_string_equal(p->base_url, "https://proxy.example/v1");
    assert_null(p->api_key);
    assert_int_equal(p->connect_timeout_ms, 5);
    loom_config_free(cfg);
}

/* ---- lookups --------------------------------------------------------------
 */

static void test_model_resolution(void **state)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    loom_config *cfg;

    (void)state;
    cfg = load_ok("providers:\n"
                  "  p: {base_url: 'http://h'}\n"
                  "models:\n"
                  "  p/listed: {upstream: up-id, context_window: 8192}\n");
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/listed"), 0);
    assert_ptr_equal(m, &cfg->models[0]);
    assert_string_equal(m->upstream, "up-id");
    assert_int_equal(m->context_window, 8192);
    assert_null(tmp.name);
    loom_model_config_clear(&tmp);

    /* Unlisted: the upstream id is everything after the first '/'. */
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/org/model-x"), 0);
    assert_ptr_equal(m, &tmp);
    assert_string_equal(tmp.name, "p/org/model-x");
    assert_string_equal(tmp.provider, "p");
    assert_string_equal(tmp.upstream, "org/model-x");
    assert_int_equal(tmp.context_window, 0);
    assert_int_equal(tmp.max_output_tokens, 0);
    loom_model_config_clear(&tmp);
    assert_null(tmp.name);
    loom_model_config_clear(&tmp); /* twice is fine */
    loom_model_config_clear(NULL);

    assert_int_equal(loom_config_model(&m, &tmp, cfg, "q/model"),
                     LOOM_ENOTFOUND);
    assert_null(m);
    assert_non_null(strstr(loom_error_last(), "'q'"));
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "model"), LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "provider/model"));
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/"), LOOM_ENOTFOUND);
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "/m"), LOOM_ENOTFOUND);
    assert_int_equal(loom_config_model(&m, NULL, cfg, "p/other"),
                     LOOM_EINVALID);
    assert_int_equal(loom_config_model(&m, NULL, cfg, "p/listed"), 0);
    assert_int_equal(loom_config_model(&m, &tmp, NULL, "p/x"), LOOM_EINVALID);

    assert_null(loom_config_provider(cfg, "nope"));
    assert_null(loom_config_provider(cfg, NULL));
    assert_null(loom_config_provider(NULL, "p"));
    assert_null(loom_config_agent(NULL, "a"));
    loom_config_free(cfg);
}

/* The one rule for names users give (docs/routing.md#model-names). */
static void test_model_names(void **state)
{
    loom_config *cfg;
    char *out = NULL;

    (void)state;
    cfg = load_ok("providers:\n"
                  "  p: {base_url: 'http://h'}\n"
                  "  q: {base_url: 'http://h'}\n"
                  "models:\n"
                  "  q/listed: {upstream: up-id}\n");
    /* provider/model: that model, listed or not, of a known provider. */
    assert_int_equal(loom_router_resolve_name(&out, cfg, "p/x", NULL), 0);
    assert_string_equal(out, "p/x");
    free(out);
    assert_int_equal(loom_router_resolve_name(&out, cfg, "z/x", NULL),
                     LOOM_ENOTFOUND);
    assert_null(out);
    assert_non_null(strstr(loom_error_last(), "'z'"));
    /* A bare name: the listed model it names (after its provider or by
     * its upstream id), else that model of the default's provider. */
    assert_int_equal(loom_router_resolve_name(&out, cfg, "listed", "p/m"), 0);
    assert_string_equal(out, "q/listed");
    free(out);
    assert_int_equal(loom_router_resolve_name(&out, cfg, "up-id", "p/m"), 0);
    assert_string_equal(out, "q/listed");
    free(out);
    assert_int_equal(loom_router_resolve_name(&out, cfg, "gpt-4o", "q/m"), 0);
    assert_string_equal(out, "q/gpt-4o");
    free(out);
    assert_int_equal(loom_router_resolve_name(&out, cfg, "gpt-4o", NULL), 0);
    assert_string_equal(out, "p/gpt-4o");
    free(out);
    assert_int_equal(loom_router_resolve_name(&out, cfg, "", NULL),
                     LOOM_EINVALID);
    loom_config_free(cfg);

    /* No provider: a bare name goes nowhere. */
    cfg = load_ok("models: {}\n");
    assert_int_equal(loom_router_resolve_name(&out, cfg, "gpt-4o", NULL),
                     LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "no model provider"));
    assert_null(out);
    loom_config_free(cfg);
}

/* ---- the environment's providers ------------------------------------ */

static void test_env_providers(void **state)
{
    loom_config *cfg = NULL;
    const loom_provider_config *p;
    const loom_model_config *m;
    loom_model_config tmp;

    (void)state;
    /* A key alone makes the provider, with its public endpoint. */
    setenv("ANTHROPIC_API_KEY", "sk-ant", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 1);
    p = loom_config_provider(cfg, "anthropic");
    assert_non_null(p);
    assert_string_equal(p->kind, "anthropic");
    assert_string_equal(p->base_url, "https://api.anthropic.com");
    assert_string_equal(p->api_key, "sk-ant");
    assert_int_equal(p->max_retries, 2);
    assert_null(loom_config_provider(cfg, "openai"));
    /* So "anthropic/<model>" resolves with nothing else. */
    assert_int_equal(
        loom_config_model(&m, &tmp, cfg, "anthropic/claude-sonnet-4-5"), 0);
    assert_string_equal(m->provider, "anthropic");
    assert_string_equal(m->upstream, "claude-sonnet-4-5");
    loom_model_config_clear(&tmp);
    loom_config_free(cfg);

    setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/anthropic/", 1);
    setenv("GEMINI_API_KEY", "gm-key", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 2);
    assert_string_equal(loom_config_provider(cfg, "anthropic")->base_url,
                        "http://127.0.0.1:9/anthropic");
    p = loom_config_provider(cfg, "gemini");
    assert_non_null(p);
    assert_string_equal(p->kind, "gemini");
    assert_string_equal(p->base_url,
                        "https://generativelanguage.googleapis.com");
    assert_string_equal(p->api_key, "gm-key");
    loom_config_free(cfg);

    /* Every variable: four providers. */
    setenv("OPENAI_API_KEY", "sk-oai", 1);
    setenv("GEMINI_BASE_URL", "http://127.0.0.1:9/g", 1);
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 4);
    assert_string_equal(loom_config_provider(cfg, "gemini")->base_url,
                        "http://127.0.0.1:9/g");
    assert_string_equal(loom_config_provider(cfg, "openai")->kind, "openai");
    assert_string_equal(loom_config_provider(cfg, "openai-responses")->kind,
                        "openai-responses");
    loom_config_free(cfg);

    /* A base URL alone is enough, as for OpenAI. */
    unsetenv("GEMINI_API_KEY");
    unsetenv("ANTHROPIC_API_KEY");
    unsetenv("OPENAI_API_KEY");
    assert_int_equal(loom_config_from_env(&cfg), 0);
    assert_int_equal(cfg->providers_len, 2);
    assert_null(loom_config_provider(cfg, "anthropic")->api_key);
    assert_null(loom_config_provider(cfg, "gemini")->api_key);
    loom_config_free(cfg);

    /* A bad base URL names its variable. */
    setenv("GEMINI_BASE_URL", "generativelanguage.googleapis.com", 1);
    cfg = (loom_config *)0x1;
    assert_int_equal(loom_config_from_env(&cfg), LOOM_EINVALID);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), "environment: GEMINI_BASE_URL"));
    unsetenv("GEMINI_BASE_URL");
    setenv("ANTHROPIC_BASE_URL", "ftp://x", 1);
    expect_fail("", LOOM_EINVALID, "ANTHROPIC_BASE_URL", "'ftp://x'", NULL);

    /* A file provider of the same name replaces the environment's. */
    setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/a", 1);
    setenv("ANTHROPIC_API_KEY", "sk-ant", 1);
    cfg = load_ok("providers:\n"
                  "  anthropic: {kind: anthropic, api_key: other}\n");
    p = loom_config_provider(cfg, "anthropic");
    assert_string_equal(p->api_key, "other");
    assert_string_equal(p->base_url, "https://api.anthropic.com");
    loom_config_free(cfg);
}

/* ---- model settings for routing ------------------------------------- */

static void test_model_settings(void **state)
{
    static const char head[] = "providers: {p: {base_url: 'http://h'}}\n"
                               "models:\n"
                               "  p/m:\n";
    char yaml[1024];
    loom_config *cfg;
    const loom_model_config *m;
    loom_model_config tmp;

    (void)state;
    snprintf(yaml, sizeof(yaml),
             "%s    capabilities: {reasoning: yes, tools: no}\n"
             "    reasoning: {effort: minimal}\n"
             "    chain_responses: true\n",
             head);
    cfg = load_ok(yaml);
    m = &cfg->models[0];
    assert_int_equal(m->capabilities.reasoning, 1);
    assert_int_equal(m->capabilities.tools, 0);
    assert_int_equal(m->capabilities.parallel_tool_calls, 1);
    assert_int_equal(m->capabilities.vision, 0);
    assert_string_equal(m->reasoning_effort, "minimal");
    assert_int_equal(m->thinking_budget, 0);
    assert_int_equal(m->chain_responses, 1);
    assert_int_equal(m->prompt_cache, 0);
    loom_config_free(cfg);

    /* Reasoning controls only on a model that says it has them. */
    snprintf(yaml, sizeof(yaml), "%s    reasoning: {effort: low}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.reasoning: reasoning controls need "
                "capabilities.reasoning: true",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    capabilities: {reasoning: false}\n"
             "    reasoning: {thinking_budget: 1024}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:5: models.p/m.reasoning: ",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    capabilities: {reasoning: true}\n"
             "    reasoning: {effort: extreme}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:5: models.p/m.reasoning.effort: must be minimal, low, "
                "medium or high, got 'extreme'",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    capabilities: {reasoning: true}\n"
             "    reasoning: {budget: 5}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:5: models.p/m.reasoning: ",
                "unknown key 'budget' (known: effort, thinking_budget)", NULL);
    snprintf(yaml, sizeof(yaml), "%s    capabilities: {audio: true}\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:4: models.p/m.capabilities: ",
                "unknown key 'audio' (known: tools, parallel_tool_calls, "
                "reasoning, vision, max_completion_tokens)",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    capabilities: {vision: maybe}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.capabilities.vision: must be true or "
                "false, got 'maybe'",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    prompt_cache: 1\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prompt_cache: must be true or false",
                NULL);

    /* An unlisted model gets the defaults and the top-level policy. */
    cfg = load_ok("providers: {p: {base_url: 'http://h'}}\n"
                  "routing: {cooldown_ms: 0}\n");
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/other"), 0);
    assert_ptr_equal(m, &tmp);
    assert_int_equal(tmp.capabilities.tools, 1);
    assert_int_equal(tmp.capabilities.parallel_tool_calls, 1);
    assert_int_equal(tmp.capabilities.reasoning, 0);
    assert_int_equal(tmp.prices.set, 0);
    assert_int_equal(tmp.fallbacks_len, 0);
    assert_int_equal(tmp.routing.cooldown_ms, 0);
    assert_int_equal(tmp.routing.retries, 0);
    assert_int_equal(tmp.routing.failures_before_cooldown, 3);
    loom_model_config_clear(&tmp);
    loom_config_free(cfg);

    /* The defaults of the top-level policy. */
    cfg = load_ok("");
    assert_int_equal(cfg->routing.retries, 0);
    assert_int_equal(cfg->routing.cooldown_ms, 30000);
    assert_int_equal(cfg->routing.failures_before_cooldown, 3);
    loom_config_free(cfg);
    expect_fail("routing: {after: 3}\n", LOOM_EINVALID,
                "t.yaml:1: routing: unknown key 'after' (known: retries, "
                "cooldown_ms, failures_before_cooldown)",
                NULL);
}

/* ---- prices ------------------------------------------------------------ */

static void test_price_parse(void **state)
{
    static const struct {
        const char *text;
        int64_t micros;
    } good[] = {
        {"0", 0},
        {"0.15", 150000},
        {"0.29", 290000}, /* 0.29 * 1e6 is 289999.99999999994 in double */
        {"0.075", 75000},
        {"3", 3000000},
        {"2.50", 2500000},
        {"15.000000", 15000000},
        {"0.000001", 1},
        {"1.1", 1100000},
        {"600", 600000000},
        {"0000000.5", 500000},
        {"1000000", 1000000000000LL}, /* the most allowed */
        {"1000000.000000", 1000000000000LL},
    };
    static const char *const bad[] = {
        "", "-1", "+1", "1e-3", "1E6", ".5", "5.", "1.2.3", " 1", "1 ",
        "0x10", "1,5", "NaN", "inf", "one", "00000000.5", "10000000",
        "1000000.000001", "99999999999999999999999"};
    int64_t v;

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = -7;
        if (loom_price_parse(&v, good[i].text) != 0)
            fail_msg("'%s': %s", good[i].text, loom_error_last());
        if (v != good[i].micros)
            fail_msg("'%s': %lld, want %lld", good[i].text, (long long)v,
                     (long long)good[i].micros);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = -7;
        if (loom_price_parse(&v, bad[i]) != LOOM_EINVALID)
            fail_msg("'%s' was accepted", bad[i]);
        assert_int_equal(v, -7);
    }
    /* The 6-decimal limit, crossed, says why. */
    assert_int_equal(loom_price_parse(&v, "0.1234567"), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "more than 6 digits"));
    assert_int_equal(loom_price_parse(&v, "0.123456"), 0);
    assert_int_equal(v, 123456);
    assert_int_equal(loom_price_parse(&v, "1000000.000001"), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "at most 1000000"));
    assert_int_equal(loom_price_parse(NULL, "1"), LOOM_EINVALID);
    assert_int_equal(loom_price_parse(&v, NULL), LOOM_EINVALID);
}

static void test_prices(void **state)
{
    static const char head[] = "providers: {p: {base_url: 'http://h'}}\n"
                               "models:\n"
                               "  p/m:\n";
    char yaml[1024];
    loom_config *cfg;
    const loom_model_prices *pr;

    (void)state;
    /* Plain numbers are read as their text: never through a double. */
    snprintf(yaml, sizeof(yaml), "%s    prices: {input: 0.15, output: 0.6}\n",
             head);
    cfg = load_ok(yaml);
    pr = &cfg->models[0].prices;
    assert_int_equal(pr->set, 1);
    assert_int_equal(pr->input, 150000);
    assert_int_equal(pr->output, 600000);
    assert_int_equal(pr->cached_input, -1);
    assert_int_equal(pr->cache_write, -1);
    assert_int_equal(pr->reasoning, -1);
    loom_config_free(cfg);

    setenv("LOOM_TEST_VAR", "1.25", 1);
    snprintf(yaml, sizeof(yaml),
             "%s    prices:\n"
             "      input: '${LOOM_TEST_VAR}'\n"
             "      cached_input: \"0.125\"\n"
             "      cache_write: 0\n"
             "      output: 10\n"
             "      reasoning: 0.000001\n",
             head);
    cfg = load_ok(yaml);
    pr = &cfg->models[0].prices;
    assert_int_equal(pr->input, 1250000);
    assert_int_equal(pr->cached_input, 125000);
    assert_int_equal(pr->cache_write, 0);
    assert_int_equal(pr->output, 10000000);
    assert_int_equal(pr->reasoning, 1);
    loom_config_free(cfg);

    /* prices: ~ is no prices. */
    snprintf(yaml, sizeof(yaml), "%s    prices: ~\n", head);
    cfg = load_ok(yaml);
    assert_int_equal(cfg->models[0].prices.set, 0);
    loom_config_free(cfg);

    snprintf(yaml, sizeof(yaml),
             "%s    prices:\n      input: 1\n      output: 0.1234567\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/m.prices.output: more than 6 digits "
                "after the decimal point",
                "got '0.1234567'", NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    prices: {input: -0.5, output: 1}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prices.input: must be a price in "
                "dollars per million tokens",
                "got '-0.5'", NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    prices: {input: 1e-6, output: 1}\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:4: models.p/m.prices.input: ",
                "got '1e-6'", NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    prices: {input: 1, output: 2000000}\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:4: models.p/m.prices.output: ",
                "at most 1000000 dollars", NULL);
    snprintf(yaml, sizeof(yaml), "%s    prices: {input: 1}\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prices: missing required key "
                "'output'",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    prices: {output: 1, input: ~}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prices: missing required key 'input'",
                NULL);
    snprintf(yaml, sizeof(yaml),
             "%s    prices: {input: 1, output: 1, cached: 1}\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:4: models.p/m.prices: ",
                "unknown key 'cached' (known: input, cached_input, "
                "cache_write, output, reasoning)",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    prices: 3\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prices: must be a mapping", NULL);
    snprintf(yaml, sizeof(yaml), "%s    prices: {input: [1], output: 1}\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:4: models.p/m.prices.input: must be a price in "
                "dollars per million tokens, got a list",
                NULL);
}

/* ---- fallbacks ----------------------------------------------------------- */

static void test_fallbacks(void **state)
{
    static const char head[] = "providers:\n"
                               "  p: {base_url: 'http://h'}\n"
                               "  q: {kind: gemini}\n"
                               "models:\n"
                               "  p/a:\n";
    char yaml[1024];
    loom_config *cfg;
    const loom_model_config *m;

    (void)state;
    /* A fallback may be listed later, or not at all. */
    snprintf(yaml, sizeof(yaml),
             "%s    fallbacks: [p/b, q/gemini-2.5-flash]\n"
             "  p/b: {fallbacks: [p/a]}\n",
             head);
    cfg = load_ok(yaml);
    m = &cfg->models[0];
    assert_int_equal(m->fallbacks_len, 2);
    assert_string_equal(m->fallbacks[0], "p/b");
    assert_string_equal(m->fallbacks[1], "q/gemini-2.5-flash");
    assert_int_equal(cfg->models[1].fallbacks_len, 1);
    loom_config_free(cfg);

    /* Unknown models are named with the file, line and key. */
    snprintf(yaml, sizeof(yaml), "%s    fallbacks:\n      - p/b\n"
                                 "      - zz/x\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:8: models.p/a.fallbacks[1]: model 'zz/x' is not "
                "listed under models and its provider 'zz' is not defined "
                "(providers: p, q)",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    fallbacks: [gpt-4o]\n", head);
    expect_fail(yaml, LOOM_EINVALID, "t.yaml:6: models.p/a.fallbacks[0]: ",
                "is not of the form provider/model", NULL);
    snprintf(yaml, sizeof(yaml), "%s    fallbacks: [p/a]\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/a.fallbacks[0]: a model cannot be its "
                "own fallback",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    fallbacks: [p/b, q/c, p/b]\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/a.fallbacks[2]: 'p/b' is listed twice",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    fallbacks: p/b\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/a.fallbacks: must be a list of model "
                "names, got a scalar",
                NULL);
    snprintf(yaml, sizeof(yaml), "%s    fallbacks: [~]\n", head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/a.fallbacks[0]: must be a model name, "
                "got null",
                NULL);

    /* The limit: 8 fallbacks, not 9. */
    snprintf(yaml, sizeof(yaml),
             "%s    fallbacks: [p/1, p/2, p/3, p/4, p/5, p/6, p/7, p/8]\n",
             head);
    cfg = load_ok(yaml);
    assert_int_equal(cfg->models[0].fallbacks_len, LOOM_MODEL_MAX_FALLBACKS);
    loom_config_free(cfg);
    snprintf(yaml, sizeof(yaml),
             "%s    fallbacks: [p/1, p/2, p/3, p/4, p/5, p/6, p/7, p/8, "
             "p/9]\n",
             head);
    expect_fail(yaml, LOOM_EINVALID,
                "t.yaml:6: models.p/a.fallbacks: at most 8 fallbacks, got 9",
                NULL);
}

static void test_tool_choice_parse(void **state)
{
    loom_tool_choice tc;

    (void)state;
    assert_int_equal(loom_tool_choice_parse(&tc, "auto"), 0);
    assert_int_equal(tc.kind, LOOM_TOOL_CHOICE_AUTO);
    assert_null(tc.function);
    assert_int_equal(loom_tool_choice_parse(&tc, "none"), 0);
    assert_int_equal(tc.kind, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(loom_tool_choice_parse(&tc, "required"), 0);
    assert_int_equal(tc.kind, LOOM_TOOL_CHOICE_REQUIRED);
    assert_null(tc.function);
    assert_int_equal(loom_tool_choice_parse(&tc, "get_time"), 0);
    assert_int_equal(tc.kind, LOOM_TOOL_CHOICE_FUNCTION);
    assert_string_equal(tc.function, "get_time");
    free(tc.function);
    assert_int_equal(loom_tool_choice_parse(&tc, ""), LOOM_EINVALID);
    assert_int_equal(loom_tool_choice_parse(&tc, NULL), LOOM_EINVALID);
    assert_int_equal(loom_tool_choice_parse(&tc, "a b"), LOOM_EINVALID);
    assert_int_equal(loom_tool_choice_parse(&tc, "Auto-1_x"), 0);
    free(tc.function);
    assert_int_equal(
        loom_tool_choice_parse(&tc, "x123456789012345678901234567890123456789"
                                    "0123456789012345678901234"),
        LOOM_EINVALID); /* 65 characters */
    assert_int_equal(tc.kind, LOOM_TOOL_CHOICE_AUTO);
    assert_null(tc.function);
}

/* ---- files and limits -----------------------------------------------------
 */

static void test_file_errors(void **state)
{
    loom_config *cfg = (loom_config *)0x1;
    char *dir = tmp_dir();

    (void)state;
    assert_int_equal(loom_config_load(&cfg, "/nonexistent/loom.yaml"),
                     LOOM_ENOTFOUND);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), "/nonexistent/loom.yaml"));
    assert_int_equal(loom_config_load(&cfg, dir), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "directory"));
    assert_int_equal(loom_config_load(&cfg, NULL), LOOM_EINVALID);
    assert_int_equal(loom_config_load_string(&cfg, NULL, "x"), LOOM_EINVALID);
    loom_config_free(NULL);
    rmdir(dir);
    free(dir);
}

static void test_file_too_large(void **state)
{
    size_t max = 4 * MIB;
    char *data = malloc(max + 2), *dir = tmp_dir(), *path;
    loom_config *cfg = NULL;

    (void)state;
    assert_non_null(data);
    /* Exactly 4 MiB of comments is a valid, empty config. */
    memset(data, '#', max);
    for (size_t i = 1023; i < max; i += 1024)
        data[i] = '\n';
    data[max] = '\0';
    path = write_file(dir, "big.yaml", data, max);
    assert_int_equal(loom_config_load(&cfg, path), 0);
    loom_config_free(cfg);
    cfg = load_ok(data);
    loom_config_free(cfg);
    unlink(path);
    free(path);

    /* One byte more is refused, from a file and from a string. */
    data[max] = '#';
    data[max + 1] = '\0';
    path = write_file(dir, "big.yaml", data, max + 1);
    cfg = (loom_config *)0x1;
    assert_int_equal(loom_config_load(&cfg, path), LOOM_ETOOLARGE);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), "big.yaml"));
    assert_non_null(strstr(loom_error_last(), "4 MiB"));
    expect_fail(data, LOOM_ETOOLARGE, "t.yaml", "4 MiB", NULL);
    unlink(path);
    free(path);

    /* Through a pipe the size is not known up front: the read limit holds. */
    {
        int fds[2];
        pid_t pid;
        char fdpath[64];

        assert_int_equal(pipe(fds), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            size_t off = 0;
            close(fds[0]);
            while (off < max + 1) {
                ssize_t n = write(fds[1], data + off, max + 1 - off);
                if (n <= 0)
                    _exit(0);
                off += (size_t)n;
            }
            _exit(0);
        }
        close(fds[1]);
        snprintf(fdpath, sizeof(fdpath), "/dev/fd/%d", fds[0]);
        assert_int_equal(loom_config_load(&cfg, fdpath), LOOM_ETOOLARGE);
        close(fds[0]);
        waitpid(pid, NULL, 0);
    }
    rmdir(dir);
    free(dir);
    free(data);
}

/* "<head>[[...1...]]<tail>": `lists` nested lists. */
static void nested(char *dst, size_t cap, const char *head, int lists,
                   const char *tail)
{
    size_t n = strlen(head);

    assert_true(n + 2 * (size_t)lists + strlen(tail) + 2 <= cap);
    memcpy(dst, head, n);
    for (int i = 0; i < lists; i++)
        dst[n++] = '[';
    dst[n++] = '1';
    for (int i = 0; i < lists; i++)
        dst[n++] = ']';
    strcpy(dst + n, tail);
}

static void test_nesting_limit(void **state)
{
    char yaml[512];
    loom_config *cfg;
    json_t *v;
    int depth = 0;

    (void)state;
    /* The top mapping, tools' mapping and t's mapping are 3 levels: with
     * 61 lists inside, the deepest is level 64, which is allowed. */
    nested(yaml, sizeof(yaml), "tools: {t: {a: ", 61, "}}\n");
    cfg = load_ok(yaml);
    v = json_object_get(json_object_get(cfg->tools, "t"), "a");
    while (json_is_array(v)) {
        depth++;
        v = json_array_get(v, 0);
    }
    assert_int_equal(depth, 61);
    assert_int_equal(json_integer_value(v), 1);
    loom_config_free(cfg);

    nested(yaml, sizeof(yaml), "tools: {t: {a: ", 62, "}}\n");
    expect_fail(yaml, LOOM_ETOOLARGE, "t.yaml:1: nesting deeper than 64", NULL);

    /* Aliases can nest deeper than the text does; that is caught too:
     * the lists under t.a reach level 64, under u.b they land at 65. */
    nested(yaml, sizeof(yaml), "tools: {t: {a: &x ", 61, "}, u: {b: [*x]}}\n");
    expect_fail(yaml, LOOM_ETOOLARGE, "t.yaml:1: tools.u.b[0]",
                "nesting deeper than 64", NULL);
}

static void test_alias_expansion_limit(void **state)
{
    /* Ten levels of ten aliases each: 10^10 nodes if expanded. */
    const char *yaml = "tools:\n"
                       "  t:\n"
                       "    a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                       "    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                       "    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                       "    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                       "    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                       "    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                       "    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
                       "    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n";
    loom_config *cfg;

    (void)state;
    expect_fail(yaml, LOOM_ETOOLARGE, "t.yaml:", "more than 100000 nodes",
                NULL);
    /* A few aliases are fine. */
    cfg = load_ok("tools:\n"
                  "  t: &s {zone: UTC}\n"
                  "  u: *s\n");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(cfg->tools, "u"), "zone")),
                        "UTC");
    loom_config_free(cfg);
    /* A recursive alias ends in an error, not a loop. */
    {
        loom_config *c2 = NULL;
        int rc =
            loom_config_load_string(&c2, "tools:\n  t: &r {a: *r}\n", "t.yaml");
        assert_true(rc < 0);
        assert_null(c2);
    }
}

static void test_text_limit(void **state)
{
    size_t len = MIB;
    char *big = malloc(len + 1), yaml[2048], *p = yaml;
    loom_config *cfg;

    (void)state;
    assert_non_null(big);
    memset(big, 'x', len);
    big[len] = '\0';
    assert_int_equal(setenv("LOOM_TEST_BIG", big, 1), 0);
    free(big);
    /* 15 copies of 1 MiB fit under 16 MiB... */
    p += sprintf(p, "tools:\n  t:\n    v: [");
    for (int i = 0; i < 15; i++)
        p += sprintf(p, "%s'${LOOM_TEST_BIG}'", i ? ", " : "");
    strcpy(p, "]\n");
    cfg = load_ok(yaml);
    assert_int_equal(
        json_array_size(json_object_get(json_object_get(cfg->tools, "t"), "v")),
        15);
    loom_config_free(cfg);
    /* ...17 do not. */
    p = yaml;
    p += sprintf(p, "tools:\n  t:\n    v: [");
    for (int i = 0; i < 17; i++)
        p += sprintf(p, "%s'${LOOM_TEST_BIG}'", i ? ", " : "");
    strcpy(p, "]\n");
    expect_fail(yaml, LOOM_ETOOLARGE, "t.yaml:3: tools.t.v[",
                "more than 16 MiB of text", NULL);
    unsetenv("LOOM_TEST_BIG");
}

/* ---- the shipped example ---------------------------------------------- */

static void test_example_loads(void **state)
{
    loom_config *cfg = NULL;
    const loom_agent_config *a;

    (void)state;
    setenv("OPENAI_API_KEY", "sk-example", 1);
    if (loom_config_load(&cfg, LOOM_SOURCE_DIR "/loom.example.yaml") != 0)
        print_error("%s\n", loom_error_last());
    assert_non_null(cfg);
    assert_string_equal(loom_config_provider(cfg, "openai")->api_key,
                        "sk-example");
    assert_null(loom_config_provider(cfg, "ollama")->api_key);
    assert_string_equal(loom_config_provider(cfg, "ollama")->base_url,
                        "http://127.0.0.1:11434/v1");
    assert_int_equal(cfg->models_len, 3);
    assert_int_equal(cfg->agents_len, 3);
    assert_int_equal(loom_config_agent(cfg, "researcher")->planning, 1);
    assert_int_equal(loom_config_agent(cfg, "researcher")->citations, 1);
    assert_int_equal(cfg->http_tools_len, 1);
    assert_string_equal(cfg->models[0].context_window_fallback,
                        "anthropic/claude-haiku-4-5");
    assert_string_equal(loom_config_provider(cfg, "anthropic")->kind,
                        "anthropic");
    assert_int_equal(cfg->models[0].prices.input, 150000);
    assert_int_equal(cfg->models[0].fallbacks_len, 1);
    a = loom_config_agent(cfg, cfg->default_agent);
    assert_non_null(a);
    assert_int_equal(a->tools_len, 1);
    assert_string_equal(a->tools[0], "get_time");
    assert_non_null(json_object_get(cfg->tools, "get_time"));
    loom_config_free(cfg);

    /* Without the key it fails, naming the variable. */
    unsetenv("OPENAI_API_KEY");
    assert_int_equal(
        loom_config_load(&cfg, LOOM_SOURCE_DIR "/loom.example.yaml"),
        LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "OPENAI_API_KEY"));
}

/* capabilities.max_completion_tokens: unset is -1 (by family), else as
 * given; the families that take only max_completion_tokens. */
static void test_max_completion_tokens(void **state)
{
    loom_config *cfg = NULL;
    const char *yaml = "providers: {p: {base_url: 'http://h'}}\n"
                       "models:\n"
                       "  p/a: {}\n"
                       "  p/b: {capabilities: {max_completion_tokens: true}}\n"
                       "  p/c: {capabilities: {max_completion_tokens: "
                       "false}}\n";

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    assert_int_equal(cfg->models[0].capabilities.max_completion_tokens, -1);
    assert_int_equal(cfg->models[1].capabilities.max_completion_tokens, 1);
    assert_int_equal(cfg->models[2].capabilities.max_completion_tokens, 0);
    loom_config_free(cfg);

    assert_int_equal(loom_config_known_max_completion_tokens("o1"), 1);
    assert_int_equal(loom_config_known_max_completion_tokens("o3-mini"), 1);
    assert_int_equal(loom_config_known_max_completion_tokens("o4-mini"), 1);
    assert_int_equal(loom_config_known_max_completion_tokens("gpt-5"), 1);
    assert_int_equal(loom_config_known_max_completion_tokens("gpt-5.1"), 1);
    assert_int_equal(
        loom_config_known_max_completion_tokens("openai/gpt-5-mini"), 1);
    assert_int_equal(loom_config_known_max_completion_tokens("gpt-4o"), 0);
    assert_int_equal(loom_config_known_max_completion_tokens("gpt-4.1"), 0);
    assert_int_equal(loom_config_known_max_completion_tokens("o1x"), 0);
    assert_int_equal(loom_config_known_max_completion_tokens("claude-3"), 0);
    assert_int_equal(loom_config_known_max_completion_tokens(NULL), 0);
}

/* ---- every error of a file ---------------------------------------------- */

/* Lines of text, and the last one. */
static size_t count_lines(const char *text, const char **last)
{
    size_t n = 1;

    *last = text;
    for (const char *p = text; *p; p++)
        if (*p == '\n') {
            n++;
            *last = p + 1;
        }
    return n;
}

/* Three mistakes in three sections: three lines, in the order they are
 * read, the first one the message a single error always had. */
static void test_all_errors_reported(void **state)
{
    static const char yaml[] = "log: {level: loud}\n"
                               "providers:\n"
                               "  p: {base_url: 'http://h'}\n"
                               "agents:\n"
                               "  a:\n"
                               "    model: p/m\n"
                               "    max_iterations: 0\n"
                               "server:\n"
                               "  listen: nowhere\n";
    static const char want[] =
        "t.yaml:1: log.level: must be debug, info, warn, error or off, got "
        "'loud'\n"
        "t.yaml:7: agents.a.max_iterations: must be an integer from 1 to "
        "1000, got '0'\n"
        "t.yaml:9: server.listen: must be HOST:PORT (port 0..65535), got "
        "'nowhere'";
    loom_config *cfg = (loom_config *)0x1;
    char *errors = (char *)0x1;

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"),
                     LOOM_EINVALID);
    assert_null(cfg);
    assert_string_equal(loom_error_last(), want);
    assert_int_equal(
        loom_config_load_string_report(&cfg, yaml, "t.yaml", &errors),
        LOOM_EINVALID);
    assert_string_equal(errors, want);
    free(errors);

    /* A success leaves no list; an unreadable file gives a list of one. */
    errors = (char *)0x1;
    assert_int_equal(loom_config_load_string_report(
                         &cfg, "log: {level: info}\n", "t.yaml", &errors),
                     0);
    assert_null(errors);
    loom_config_free(cfg);
    assert_int_equal(
        loom_config_load_report(&cfg, "/nonexistent/loom.yaml", &errors),
        LOOM_ENOTFOUND);
    assert_string_equal(errors, loom_error_last());
    free(errors);
}

/* The first error's code is returned, whatever follows it. */
static void test_first_error_code(void **state)
{
    (void)state;
    expect_fail("agents: {a: {model: nowhere/m}}\n"
                "providers: {p: {timeouts: {connect_ms: 0}}}\n",
                LOOM_EINVALID,
                "t.yaml:2: providers.p: missing required key 'base_url'",
                "\nt.yaml:2: providers.p.timeouts.connect_ms: must be an "
                "integer",
                "\nt.yaml:1: agents.a.model: ", NULL);
}

/* A mistake is reported once: what depends on a field in error (a model
 * of a provider with a bad setting, the base URL a bad kind would need,
 * delays compared with a bad one, a tool_choice among tools in error) is
 * not reported again under another name. */
static void test_errors_not_repeated(void **state)
{
    static const char yaml[] =
        "providers:\n"
        "  p:\n"
        "    kind: antropic\n"
        "    retries: {base_delay_ms: 60000, max_delay_ms: x}\n"
        "agents:\n"
        "  a: {model: p/m, tools: [get_time, 'x y'], tool_choice: web_search}\n"
        "default_agent: a\n";
    const char *last;
    char *errors = NULL;
    loom_config *cfg;

    (void)state;
    assert_int_equal(
        loom_config_load_string_report(&cfg, yaml, "t.yaml", &errors),
        LOOM_EINVALID);
    assert_int_equal(count_lines(errors, &last), 3);
    assert_non_null(strstr(errors, "t.yaml:3: providers.p.kind: "));
    assert_non_null(
        strstr(errors, "t.yaml:4: providers.p.retries.max_delay_ms: "));
    assert_string_equal(last, "t.yaml:6: agents.a.tools[1]: 'x y' is not a "
                              "valid tool name ([a-zA-Z0-9_-]{1,64})");
    free(errors);

    /* Unknown and repeated keys are skipped, the rest still read. */
    expect_fail("log: {lvl: info, level: loud, format: json, format: text}\n",
                LOOM_EINVALID, "t.yaml:1: log: unknown key 'lvl'",
                "\nt.yaml:1: log: duplicate key 'format'\n",
                "\nt.yaml:1: log.level: must be", NULL);
}

/* 25 mistakes: the first 20 listed, then "... and 5 more errors"; the
 * message holds whole lines only, and says how many it left out. */
static void test_error_limit(void **state)
{
    char yaml[8192], line[128], more[64], *errors = NULL;
    size_t len = 0, n;
    const char *last;
    loom_config *cfg;

    (void)state;
    len += (size_t)snprintf(yaml + len, sizeof(yaml) - len,
                            "providers: {p: {base_url: 'http://h'}}\n"
                            "agents:\n");
    for (int i = 0; i < 25; i++)
        len += (size_t)snprintf(yaml + len, sizeof(yaml) - len,
                                "  a%d: {model: p/m, max_iterations: 0}\n", i);
    assert_true(len < sizeof(yaml) - 1);
    assert_int_equal(
        loom_config_load_string_report(&cfg, yaml, "t.yaml", &errors),
        LOOM_EINVALID);
    assert_int_equal(count_lines(errors, &last), LOOM_CONFIG_MAX_ERRORS + 1);
    assert_int_equal(LOOM_CONFIG_MAX_ERRORS, 20);
    assert_string_equal(last, "... and 5 more errors");
    snprintf(line, sizeof(line),
             "t.yaml:22: agents.a19.max_iterations: must be an integer from "
             "1 to 1000, got '0'\n... and 5 more errors");
    assert_non_null(strstr(errors, line));
    assert_null(strstr(errors, "a20"));

    /* The message: the first line, then whole lines while they fit. */
    assert_memory_equal(loom_error_last(),
                        "t.yaml:3: agents.a0.max_iterations: must be",
                        strlen("t.yaml:3: agents.a0.max_iterations: must be"));
    n = count_lines(loom_error_last(), &last);
    assert_true(n > 2 && n < 21);
    snprintf(more, sizeof(more), "... and %zu more errors", 25 - (n - 1));
    assert_string_equal(last, more);
    assert_true(strlen(loom_error_last()) < 1024);
    assert_memory_equal(loom_error_last(), errors,
                        (size_t)(last - loom_error_last()));
    free(errors);
}

/* Each entry of an agent's tools keeps its line, for the session's
 * check of tool names. */
static void test_agent_tool_lines(void **state)
{
    loom_config *cfg = load_ok("providers: {p: {base_url: 'http://h'}}\n"
                               "agents:\n"
                               "  a:\n"
                               "    model: p/m\n"
                               "    tools:\n"
                               "      - get_time\n"
                               "\n"
                               "      - web_search\n"
                               "  b: {model: p/m, tools: [x, y]}\n"
                               "  c: {model: p/m}\n");
    const loom_agent_config *a = loom_config_agent(cfg, "a");
    const loom_agent_config *b = loom_config_agent(cfg, "b");

    (void)state;
    assert_string_equal(cfg->source, "t.yaml");
    assert_int_equal(a->tools_len, 2);
    assert_int_equal(a->tools_lines[0], 6);
    assert_int_equal(a->tools_lines[1], 8);
    assert_int_equal(b->tools_lines[0], 9);
    assert_int_equal(b->tools_lines[1], 9);
    assert_null(loom_config_agent(cfg, "c")->tools_lines);
    loom_config_free(cfg);
}

/* ---- files an agent names ---------------------------------------------- */

#define PROMPT_HEAD                                                            \
    "providers: {p: {base_url: 'http://h'}}\n"                                 \
    "agents:\n"                                                                \
    "  a:\n"                                                                   \
    "    model: p/m\n"

/* Writes the config c.yaml in dir and loads it: 0 or the error code. */
static int load_in(const char *dir, const char *yaml, loom_config **cfg)
{
    char *path = write_file(dir, "c.yaml", yaml, strlen(yaml));
    int rc = loom_config_load(cfg, path);

    unlink(path);
    free(path);
    return rc;
}

static void expect_in(const char *dir, const char *yaml, const char *part1,
                      const char *part2)
{
    loom_config *cfg = NULL;
    int rc = load_in(dir, yaml, &cfg);

    if (rc != LOOM_EINVALID || !strstr(loom_error_last(), part1) ||
        !strstr(loom_error_last(), part2))
        print_error("rc %d, message: %s\n", rc, loom_error_last());
    assert_int_equal(rc, LOOM_EINVALID);
    assert_null(cfg);
    assert_non_null(strstr(loom_error_last(), part1));
    assert_non_null(strstr(loom_error_last(), part2));
}

/* tool_descriptions and few_shot name YAML files read from the config
 * file's directory; their entries land in the agent. */
static void test_agent_files(void **state)
{
    char *dir = tmp_dir(), *docs, *ex, sub[4200], yaml[1024];
    const loom_agent_config *a;
    loom_config *cfg = NULL;

    (void)state;
    docs = write_file(dir, "tools.yaml",
                      "web_search:\n"
                      "  description: Search the web for recent facts.\n"
                      "  selection_rule: Use for news after 2023.\n"
                      "get_time: {selection_rule: Use for the date.}\n",
                      149);
    snprintf(sub, sizeof(sub), "%s/ex", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    ex = write_file(dir, "ex/examples.yaml",
                    "- user: What is 2+2?\n"
                    "  assistant: '4'\n"
                    "- {user: Hi, assistant: Hello!}\n",
                    70);
    snprintf(yaml, sizeof(yaml),
             "%s    tool_descriptions: tools.yaml\n"
             "    few_shot: {file: ex/examples.yaml, models: [p/m, p/x]}\n",
             PROMPT_HEAD);
    assert_int_equal(load_in(dir, yaml, &cfg), 0);
    a = &cfg->agents[0];
    assert_string_equal(a->tool_descriptions, "tools.yaml");
    assert_int_equal(a->tool_docs_len, 2);
    assert_string_equal(a->tool_docs[0].name, "web_search");
    assert_string_equal(a->tool_docs[0].description,
                        "Search the web for recent facts.");
    assert_string_equal(a->tool_docs[0].selection_rule,
                        "Use for news after 2023.");
    assert_string_equal(a->tool_docs[1].name, "get_time");
    assert_null(a->tool_docs[1].description);
    assert_string_equal(a->few_shot.file, "ex/examples.yaml");
    assert_int_equal(a->few_shot.models_len, 2);
    assert_string_equal(a->few_shot.models[1], "p/x");
    assert_int_equal(a->few_shot.examples_len, 2);
    assert_string_equal(a->few_shot.examples[0].user, "What is 2+2?");
    assert_string_equal(a->few_shot.examples[0].assistant, "4");
    assert_string_equal(a->few_shot.examples[1].assistant, "Hello!");
    loom_config_free(cfg);

    /* A file that is not there, named with the line of the key. */
    snprintf(yaml, sizeof(yaml), "%s    tool_descriptions: nope.yaml\n",
             PROMPT_HEAD);
    expect_in(dir, yaml, "c.yaml:5: agents.a.tool_descriptions: ",
              "/nope.yaml: no such file (a relative path is read from the "
              "config file's directory)");
    /* Mistakes inside a file are reported at its own lines. */
    unlink(docs);
    free(docs);
    docs = write_file(dir, "tools.yaml",
                      "web_search:\n  description: [a]\n  rule: x\n", 41);
    snprintf(yaml, sizeof(yaml), "%s    tool_descriptions: tools.yaml\n",
             PROMPT_HEAD);
    expect_in(dir, yaml, "tools.yaml:2: web_search.description: ",
              "must be a string, got a list");
    expect_in(dir, yaml, "tools.yaml:3: web_search: ",
              "unknown key 'rule' (known: description, selection_rule)");
    unlink(ex);
    free(ex);
    ex = write_file(dir, "ex/examples.yaml",
                    "- {user: Hi, assistant: Hello}\n- {user: Bye}\n", 45);
    snprintf(yaml, sizeof(yaml), "%s    few_shot: {file: ex/examples.yaml}\n",
             PROMPT_HEAD);
    expect_in(dir, yaml,
              "ex/examples.yaml:2: [1]: ", "missing required key 'assistant'");
    unlink(ex);
    free(ex);
    ex = write_file(dir, "ex/examples.yaml", "user: [unclosed\n", 16);
    expect_in(dir, yaml,
              "c.yaml:5: agents.a.few_shot.file: ", "ex/examples.yaml:2: ");
    snprintf(yaml, sizeof(yaml), "%s    few_shot: {models: [p/m]}\n",
             PROMPT_HEAD);
    expect_in(dir, yaml,
              "c.yaml:5: agents.a.few_shot: ", "missing required key 'file'");
    snprintf(yaml, sizeof(yaml),
             "%s    few_shot: {file: ex/examples.yaml, models: [q/m]}\n",
             PROMPT_HEAD);
    expect_in(dir, yaml, "agents.a.few_shot.models[0]: ", "'q'");
    unlink(ex);
    free(ex);
    rmdir(sub);
    unlink(docs);
    free(docs);
    rmdir(dir);
    free(dir);
}

/* A file over LOOM_AGENT_FILE_MAX is refused by name; an empty one too. */
static void test_agent_file_limits(void **state)
{
    char *dir = tmp_dir(), *big, *empty, yaml[512];
    char *data = malloc(LOOM_AGENT_FILE_MAX + 1);

    (void)state;
    assert_non_null(data);
    memset(data, '#', LOOM_AGENT_FILE_MAX + 1);
    big = write_file(dir, "big.yaml", data, LOOM_AGENT_FILE_MAX + 1);
    empty = write_file(dir, "empty.yaml", "# nothing\n", 10);
    snprintf(yaml, sizeof(yaml), "%s    tool_descriptions: big.yaml\n",
             PROMPT_HEAD);
    expect_in(dir, yaml, "c.yaml:5: agents.a.tool_descriptions: ",
              "/big.yaml: larger than the 256 KiB limit for this file");
    snprintf(yaml, sizeof(yaml), "%s    few_shot: {file: empty.yaml}\n",
             PROMPT_HEAD);
    expect_in(dir, yaml,
              "c.yaml:5: agents.a.few_shot.file: ", "/empty.yaml: is empty");
    unlink(big);
    unlink(empty);
    free(big);
    free(empty);
    free(data);
    rmdir(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_full_file, reset_env),
        cmocka_unit_test_setup(test_max_completion_tokens, reset_env),
        cmocka_unit_test_setup(test_defaults_and_tools_all, reset_env),
        cmocka_unit_test_setup(test_tool_rules, reset_env),
        cmocka_unit_test_setup(test_log_case, reset_env),
        cmocka_unit_test_setup(test_empty_file, reset_env),
        cmocka_unit_test_setup(test_interpolation, reset_env),
        cmocka_unit_test_setup(test_interpolation_errors, reset_env),
        cmocka_unit_test_setup(test_syntax_errors, reset_env),
        cmocka_unit_test_setup(test_unknown_keys, reset_env),
        cmocka_unit_test_setup(test_research_section, reset_env),
        cmocka_unit_test_setup(test_handoffs, reset_env),
        cmocka_unit_test_setup(test_duplicate_keys, reset_env),
        cmocka_unit_test_setup(test_wrong_types, reset_env),
        cmocka_unit_test_setup(test_bad_values, reset_env),
        cmocka_unit_test_setup(test_data_policy, reset_env),
        cmocka_unit_test_setup(test_sub_agents, reset_env),
        cmocka_unit_test_setup(test_agent_budget, reset_env),
        cmocka_unit_test_setup(test_url_forms, reset_env),
        cmocka_unit_test_setup(test_ranges, reset_env),
        cmocka_unit_test_setup(test_server_section, reset_env),
        cmocka_unit_test_setup(test_references, reset_env),
        cmocka_unit_test_setup(test_from_env, reset_env),
        cmocka_unit_test_setup(test_merge_over_env, reset_env),
        cmocka_unit_test_setup(test_model_resolution, reset_env),
        cmocka_unit_test_setup(test_model_names, reset_env),
        cmocka_unit_test_setup(test_env_providers, reset_env),
        cmocka_unit_test_setup(test_model_settings, reset_env),
        cmocka_unit_test_setup(test_price_parse, reset_env),
        cmocka_unit_test_setup(test_prices, reset_env),
        cmocka_unit_test_setup(test_fallbacks, reset_env),
        cmocka_unit_test_setup(test_tool_choice_parse, reset_env),
        cmocka_unit_test_setup(test_file_errors, reset_env),
        cmocka_unit_test_setup(test_file_too_large, reset_env),
        cmocka_unit_test_setup(test_nesting_limit, reset_env),
        cmocka_unit_test_setup(test_alias_expansion_limit, reset_env),
        cmocka_unit_test_setup(test_text_limit, reset_env),
        cmocka_unit_test_setup(test_example_loads, reset_env),
        cmocka_unit_test_setup(test_all_errors_reported, reset_env),
        cmocka_unit_test_setup(test_first_error_code, reset_env),
        cmocka_unit_test_setup(test_errors_not_repeated, reset_env),
        cmocka_unit_test_setup(test_error_limit, reset_env),
        cmocka_unit_test_setup(test_agent_tool_lines, reset_env),
        cmocka_unit_test_setup(test_agent_files, reset_env),
        cmocka_unit_test_setup(test_agent_file_limits, reset_env),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
