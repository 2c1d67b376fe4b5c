/*
 * Unit tests for the tool registry and the get_time built-in.
 *
 * Registry: order, lookup, removal, ownership (names copied, parameters
 * referenced, payload freed exactly once), name rules and duplicates;
 * sources (tools that change) and the snapshots that take them.
 *
 * get_time: offsets are checked against glibc. glibc can only answer for
 * the zone in TZ, so these tests set TZ from the (single) test thread, and
 * only here; the code under test never touches TZ. The thread test then
 * runs get_time from 8 threads at once against answers computed up front.
 * The hand-written TZif and POSIX TZ readers are also fed truncated,
 * corrupted and synthetic data under ASan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/tools.h"
#include "tools/registry.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Internal functions of src/tools/builtin_time.c. */
int loom__tz_posix_offset(const char *tz, int64_t t, int32_t *utoff);
int loom__tzif_offset(const unsigned char *data, size_t len, int64_t t,
                      int32_t *utoff);
int loom__tz_offset(const char *zone, int64_t t, int32_t *utoff);
int loom__tz_offset_in(const char *dir, const char *zone, int64_t t,
                       int32_t *utoff);

#define UNKNOWN_MARS "unknown timezone 'Mars/Olympus'; use an IANA name " \
                     "like Europe/Paris"

/* ---- registry */

static int dummy_execute(const json_t *args, const loom_tool_ctx *ctx,
                         loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "ok");
}

static int freed_count;

static void count_free(void *payload)
{
    freed_count++;
    free(payload);
}

static loom_tool make_tool(const char *name)
{
    loom_tool t = {0};

    t.name = name;
    t.description = "a test tool";
    t.execute = dummy_execute;
    return t;
}

static void add_ok(loom_tool_registry *reg, const char *name)
{
    loom_tool t = make_tool(name);

    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
}

static void assert_names(const loom_tool_registry *reg, const char *want)
{
    char *names = loom_tool_registry_names(reg);

    assert_non_null(names);
    assert_string_equal(names, want);
    free(names);
}

static void test_registry_basics(void **state)
{
    loom_tool_registry *reg = NULL;

    (void)state;
    loom_tool_registry_free(NULL);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_count(reg), 0);
    assert_null(loom_tool_registry_get(reg, "a"));
    assert_null(loom_tool_registry_at(reg, 0));
    assert_names(reg, "");

    add_ok(reg, "search");
    add_ok(reg, "fetch");
    add_ok(reg, "get_time");
    assert_int_equal(loom_tool_registry_count(reg), 3);
    assert_string_equal(loom_tool_registry_at(reg, 0)->name, "search");
    assert_string_equal(loom_tool_registry_at(reg, 1)->name, "fetch");
    assert_string_equal(loom_tool_registry_at(reg, 2)->name, "get_time");
    assert_null(loom_tool_registry_at(reg, 3));
    assert_ptr_equal(loom_tool_registry_get(reg, "fetch"),
                     loom_tool_registry_at(reg, 1));
    assert_string_equal(loom_tool_registry_get(reg, "search")->description,
                        "a test tool");
    assert_null(loom_tool_registry_get(reg, "Fetch"));
    assert_null(loom_tool_registry_get(reg, "fetc"));
    assert_names(reg, "search, fetch, get_time");
    loom_tool_registry_free(reg);
}

static void test_registry_copies_strings(void **state)
{
    loom_tool_registry *reg = NULL;
    char name[] = "mutable", desc[] = "first";
    loom_tool t = make_tool(name);
    const loom_tool *got;

    (void)state;
    t.description = desc;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    memcpy(name, "changed", 7);
    memcpy(desc, "other", 5);
    got = loom_tool_registry_get(reg, "mutable");
    assert_non_null(got);
    assert_ptr_not_equal(got->name, name);
    assert_string_equal(got->description, "first");
    assert_null(loom_tool_registry_get(reg, "changed"));

    /* A NULL description becomes "" so providers can always send it. */
    t = make_tool("nodesc");
    t.description = NULL;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_string_equal(loom_tool_registry_get(reg, "nodesc")->description,
                        "");
    loom_tool_registry_free(reg);
}

static void test_registry_duplicate_refused(void **state)
{
    loom_tool_registry *reg = NULL;
    loom_tool t = make_tool("dup");

    (void)state;
    freed_count = 0;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add_ok(reg, "dup");
    t.payload = malloc(8);
    t.free_payload = count_free;
    assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EEXISTS);
    assert_string_equal(loom_error_last(),
                        "tool 'dup' is already registered");
    /* The caller still owns the payload after a failed add. */
    assert_int_equal(freed_count, 0);
    assert_int_equal(loom_tool_registry_count(reg), 1);
    count_free(t.payload);
    loom_tool_registry_free(reg);
    assert_int_equal(freed_count, 1);
}

static void test_registry_bad_names(void **state)
{
    static const char *const bad[] = {
        "", "has space", "dot.name", "slash/name", "caf\xc3\xa9",
        "tab\t", "colon:x", "x!",
        "a12345678901234567890123456789012345678901234567890123456789012345",
    };
    char max[65];
    loom_tool_registry *reg = NULL;
    loom_tool t;

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        t = make_tool(bad[i]);
        assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EINVALID);
    }
    t = make_tool("has space");
    loom_tool_registry_add(reg, &t);
    assert_string_equal(loom_error_last(),
                        "invalid tool name 'has space': use 1 to 64 "
                        "letters, digits, '_' or '-'");
    t = make_tool(NULL);
    assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EINVALID);
    assert_int_equal(loom_tool_registry_count(reg), 0);

    /* Exactly 64 characters is the longest allowed. */
    memset(max, 'x', 64);
    max[64] = '\0';
    add_ok(reg, max);
    add_ok(reg, "A-z_0-9");
    add_ok(reg, "x");
    assert_int_equal(loom_tool_registry_count(reg), 3);
    loom_tool_registry_free(reg);
}

static void test_registry_needs_execute_and_object_schema(void **state)
{
    loom_tool_registry *reg = NULL;
    loom_tool t = make_tool("noexec");
    json_t *arr = json_array();

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    t.execute = NULL;
    assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EINVALID);
    assert_string_equal(loom_error_last(),
                        "tool 'noexec' has no execute function");
    t = make_tool("badschema");
    t.parameters = arr;
    assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EINVALID);
    assert_int_equal(arr->refcount, 1);
    assert_int_equal(loom_tool_registry_add(reg, NULL), LOOM_EINVALID);
    assert_int_equal(loom_tool_registry_add(NULL, &t), LOOM_EINVALID);
    assert_int_equal(loom_tool_registry_count(reg), 0);
    json_decref(arr);
    loom_tool_registry_free(reg);
}

static void test_registry_remove(void **state)
{
    loom_tool_registry *reg = NULL;

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_remove(reg, "a"), LOOM_ENOTFOUND);
    add_ok(reg, "a");
    add_ok(reg, "b");
    add_ok(reg, "c");
    add_ok(reg, "d");
    assert_int_equal(loom_tool_registry_remove(reg, "b"), 0);
    assert_int_equal(loom_tool_registry_remove(reg, "b"), LOOM_ENOTFOUND);
    assert_string_equal(loom_error_last(), "no tool named 'b'");
    assert_int_equal(loom_tool_registry_count(reg), 3);
    assert_names(reg, "a, c, d");
    assert_null(loom_tool_registry_get(reg, "b"));
    assert_ptr_equal(loom_tool_registry_get(reg, "c"),
                     loom_tool_registry_at(reg, 1));
    assert_ptr_equal(loom_tool_registry_get(reg, "d"),
                     loom_tool_registry_at(reg, 2));
    assert_int_equal(loom_tool_registry_remove(reg, "a"), 0);
    assert_int_equal(loom_tool_registry_remove(reg, "d"), 0);
    assert_names(reg, "c");
    /* A removed name can be used again; it goes to the end. */
    add_ok(reg, "a");
    assert_names(reg, "c, a");
    assert_int_equal(loom_tool_registry_remove(reg, "c"), 0);
    assert_int_equal(loom_tool_registry_remove(reg, "a"), 0);
    assert_int_equal(loom_tool_registry_count(reg), 0);
    assert_names(reg, "");
    loom_tool_registry_free(reg);
}

static void test_registry_clear(void **state)
{
    loom_tool_registry *reg = NULL;

    (void)state;
    loom_tool_registry_clear(NULL);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add_ok(reg, "a");
    add_ok(reg, "b");
    loom_tool_registry_clear(reg);
    assert_int_equal(loom_tool_registry_count(reg), 0);
    assert_null(loom_tool_registry_get(reg, "a"));
    add_ok(reg, "b");
    add_ok(reg, "a");
    assert_names(reg, "b, a");
    loom_tool_registry_free(reg);
}

static void test_registry_many_tools(void **state)
{
    loom_tool_registry *reg = NULL;
    char name[32];

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    for (int i = 0; i < 500; i++) {
        snprintf(name, sizeof(name), "tool_%d", i);
        add_ok(reg, name);
    }
    for (int i = 0; i < 500; i += 2) {
        snprintf(name, sizeof(name), "tool_%d", i);
        assert_int_equal(loom_tool_registry_remove(reg, name), 0);
    }
    assert_int_equal(loom_tool_registry_count(reg), 250);
    for (int i = 0; i < 500; i++) {
        const loom_tool *t;

        snprintf(name, sizeof(name), "tool_%d", i);
        t = loom_tool_registry_get(reg, name);
        if (i % 2 == 0) {
            assert_null(t);
        } else {
            assert_non_null(t);
            assert_string_equal(t->name, name);
            assert_ptr_equal(t, loom_tool_registry_at(reg, (size_t)i / 2));
        }
    }
    loom_tool_registry_free(reg);
}

/* ---- registry sources */

/* A source whose tools a test sets: tools of a registry of its own. */
typedef struct {
    loom_tool_registry *tools;
    uint64_t gen;
    int adds, waits, freed;
} fake_source;

static int fake_add(void *arg, loom_tool_registry *reg, int wait)
{
    fake_source *f = arg;

    f->adds++;
    f->waits += wait;
    for (size_t i = 0; i < loom_tool_registry_count(f->tools); i++)
        assert_int_equal(
            loom__tool_registry_share(reg, loom_tool_registry_at(f->tools, i)),
            0);
    return 0;
}

static uint64_t fake_generation(void *arg)
{
    return ((fake_source *)arg)->gen;
}

static void fake_free(void *arg)
{
    ((fake_source *)arg)->freed++;
}

static void test_registry_sources(void **state)
{
    loom_tool_registry *reg = NULL, *snap = NULL, *snap2 = NULL, *copy = NULL;
    fake_source f = {0};
    loom__tool_source src = {0};
    const char *names[] = {"fixed", "srv__*"};
    const char *others[] = {"fixed"};
    loom_tool t;

    (void)state;
    freed_count = 0;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add_ok(reg, "fixed");
    /* Without sources a registry is its own snapshot. */
    assert_int_equal(loom_tool_registry_snapshot(&snap, reg), 0);
    assert_ptr_equal(snap, reg);
    loom_tool_registry_free(snap);

    assert_int_equal(loom_tool_registry_new(&f.tools), 0);
    t = make_tool("srv__a");
    t.payload = malloc(4);
    t.free_payload = count_free;
    assert_int_equal(loom_tool_registry_add(f.tools, &t), 0);
    src.add = fake_add;
    src.generation = fake_generation;
    src.free = fake_free;
    src.arg = &f;
    src.prefix = "srv__";
    assert_int_equal(loom__tool_registry_add_source(reg, &src), 0);
    /* Its names stand whether it offers them or not; others do not. */
    assert_true(loom_tool_registry_claims(reg, "srv__a"));
    assert_true(loom_tool_registry_claims(reg, "srv__b"));
    assert_true(loom_tool_registry_claims(reg, "srv__*"));
    assert_true(loom_tool_registry_claims(reg, "s*"));
    assert_false(loom_tool_registry_claims(reg, "srv__"));
    assert_false(loom_tool_registry_claims(reg, "srvx"));
    assert_false(loom_tool_registry_claims(reg, "fixed"));
    assert_null(loom_tool_registry_get(reg, "srv__a"));

    f.gen = 3;
    assert_int_equal(loom_tool_registry_snapshot(&snap, reg), 0);
    assert_ptr_not_equal(snap, reg);
    assert_int_equal(loom_tool_registry_count(snap), 2);
    assert_string_equal(loom_tool_registry_at(snap, 0)->name, "fixed");
    assert_ptr_equal(loom_tool_registry_get(snap, "fixed"),
                     loom_tool_registry_get(reg, "fixed"));
    assert_non_null(loom_tool_registry_get(snap, "srv__a"));
    assert_int_equal(f.waits, 1);
    assert_int_equal(loom__tool_registry_built_at(snap), 3);
    assert_int_equal(loom__tool_registry_generation(reg), 3);

    /* A run that names the source's tools waits for it; one that does
     * not takes what there is. */
    assert_int_equal(loom__tool_registry_snapshot(&snap2, reg, names, 2), 0);
    assert_int_equal(f.waits, 2);
    loom_tool_registry_free(snap2);
    assert_int_equal(loom__tool_registry_snapshot(&snap2, reg, others, 1), 0);
    assert_int_equal(f.waits, 2);
    assert_int_equal(f.adds, 3);
    loom_tool_registry_free(snap2);

    /* The tools change: the old snapshot is out of date and keeps its
     * tools until it goes. */
    f.gen = 4;
    assert_int_not_equal(loom__tool_registry_generation(reg),
                         loom__tool_registry_built_at(snap));
    loom_tool_registry_clear(f.tools);
    assert_int_equal(freed_count, 0);
    assert_non_null(loom_tool_registry_get(snap, "srv__a")->payload);
    loom_tool_registry_free(snap);
    assert_int_equal(freed_count, 1);

    /* A copy carries the source; the last registry holding it frees it. */
    assert_int_equal(loom_tool_registry_new(&copy), 0);
    assert_int_equal(loom__tool_registry_carry_sources(copy, reg), 0);
    assert_int_equal(loom__tool_registry_source_count(copy), 1);
    assert_string_equal(loom__tool_registry_source_prefix(copy, 0), "srv__");
    loom_tool_registry_free(reg);
    assert_int_equal(f.freed, 0);
    assert_true(loom_tool_registry_claims(copy, "srv__z"));
    loom_tool_registry_free(copy);
    assert_int_equal(f.freed, 1);
    loom_tool_registry_free(f.tools);
}

static void test_registry_payload_freed_once(void **state)
{
    loom_tool_registry *reg = NULL;
    loom_tool t;

    (void)state;
    freed_count = 0;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    for (int i = 0; i < 4; i++) {
        char name[16];

        snprintf(name, sizeof(name), "p%d", i);
        t = make_tool(name);
        t.payload = malloc(16);
        t.free_payload = count_free;
        assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    }
    /* No free_payload: the registry must not free it. */
    t = make_tool("static");
    t.payload = &freed_count;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_non_null(loom_tool_registry_get(reg, "p1")->payload);

    assert_int_equal(loom_tool_registry_remove(reg, "p0"), 0);
    assert_int_equal(freed_count, 1);
    assert_int_equal(loom_tool_registry_remove(reg, "static"), 0);
    assert_int_equal(freed_count, 1);
    loom_tool_registry_clear(reg);
    assert_int_equal(freed_count, 4);
    t = make_tool("p9");
    t.payload = malloc(16);
    t.free_payload = count_free;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    loom_tool_registry_free(reg);
    assert_int_equal(freed_count, 5);
}

static void test_registry_parameters_refcount(void **state)
{
    loom_tool_registry *reg = NULL;
    json_t *params = json_pack("{s:s}", "type", "object");
    loom_tool t = make_tool("withparams");

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    t.parameters = params;
    assert_int_equal(params->refcount, 1);
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_int_equal(params->refcount, 2);
    assert_ptr_equal(loom_tool_registry_get(reg, "withparams")->parameters,
                     params);
    /* A refused duplicate takes no reference. */
    assert_int_equal(loom_tool_registry_add(reg, &t), LOOM_EEXISTS);
    assert_int_equal(params->refcount, 2);
    assert_int_equal(loom_tool_registry_remove(reg, "withparams"), 0);
    assert_int_equal(params->refcount, 1);
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "second";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_int_equal(params->refcount, 3);
    loom_tool_registry_free(reg);
    assert_int_equal(params->refcount, 1);
    json_decref(params);
}

/* ---- get_time through the tool interface */

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);

    if (!j)
        fail_msg("bad test JSON '%s': %s", text, err.text);
    return j;
}

static const loom_tool *get_time_tool(loom_tool_registry **reg)
{
    const loom_tool *t;

    assert_int_equal(loom_tool_registry_new(reg), 0);
    assert_int_equal(loom_tools_add_builtins(*reg), 0);
    t = loom_tool_registry_get(*reg, "get_time");
    assert_non_null(t);
    return t;
}

/*
 * Runs get_time with the given args and settings (JSON text or NULL).
 * Returns the code; *out_text is the output (caller frees).
 */
static int run_get_time(const loom_tool *t, const char *args_text,
                        const char *settings_text, char **out_text)
{
    json_t *args = args_text ? parse(args_text) : NULL;
    json_t *settings = settings_text ? parse(settings_text) : NULL;
    loom_cancel cancel = LOOM_CANCEL_INIT;
    loom_tool_ctx ctx = {.call_id = "call_1",
                         .tool_name = "get_time",
                         .cancel = &cancel,
                         .settings = settings};
    loom_buf out = LOOM_BUF_INIT(64 * 1024);
    int rc;

    /* The run loop validates first; so do we. */
    if (args)
        assert_int_equal(loom_schema_validate(t->parameters, args, NULL), 0);
    rc = t->execute(args, &ctx, &out, t->payload);
    *out_text = loom_buf_detach(&out);
    json_decref(args);
    json_decref(settings);
    return rc;
}

static const char *const weekday_names[] = {
    "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
    "Saturday"};

/* "+01:00" from seconds east of UTC. */
static void offset_text(long off, char *buf, size_t size)
{
    int a = (int)(off < 0 ? -off : off) % (100 * 3600);

    snprintf(buf, size, "%c%02d:%02d", off < 0 ? '-' : '+', a / 3600,
             a / 60 % 60);
}

/*
 * Checks a get_time result: the zone, the offset, and that iso and
 * weekday are the unix time shifted by that offset (computed with
 * gmtime_r, which is thread-safe). Returns the unix time.
 */
static int64_t check_result(const char *text, const char *zone,
                            const char *offset)
{
    json_t *r = parse(text);
    struct tm tm;
    time_t local;
    char iso[64];
    json_int_t unix_time;
    long off;
    int h, m;

    assert_true(json_is_object(r));
    assert_int_equal(json_object_size(r), 5);
    assert_string_equal(json_string_value(json_object_get(r, "timezone")),
                        zone);
    assert_string_equal(json_string_value(json_object_get(r, "utc_offset")),
                        offset);
    assert_true(json_is_integer(json_object_get(r, "unix")));
    unix_time = json_integer_value(json_object_get(r, "unix"));
    assert_int_equal(sscanf(offset + 1, "%d:%d", &h, &m), 2);
    off = (offset[0] == '-' ? -1 : 1) * (h * 3600L + m * 60L);
    local = (time_t)unix_time + off;
    assert_non_null(gmtime_r(&local, &tm));
    snprintf(iso, sizeof(iso), "%04d-%02d-%02dT%02d:%02d:%02d%s",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, offset);
    assert_string_equal(json_string_value(json_object_get(r, "iso")), iso);
    assert_string_equal(json_string_value(json_object_get(r, "weekday")),
                        weekday_names[tm.tm_wday]);
    json_decref(r);
    return (int64_t)unix_time;
}

static void set_tz(const char *tz)
{
    if (tz)
        setenv("TZ", tz, 1);
    else
        unsetenv("TZ");
    tzset();
}

/* What glibc says the offset of zone is at t (TZ must be set). */
static long glibc_offset(int64_t t)
{
    time_t tt = (time_t)t;
    struct tm tm;

    assert_non_null(localtime_r(&tt, &tm));
    return tm.tm_gmtoff;
}

static void test_get_time_registered(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    json_t *want = parse(
        "{\"type\":\"object\",\"properties\":{\"timezone\":{\"type\":"
        "\"string\",\"description\":\"IANA timezone name like "
        "Europe/Paris; default UTC\"}},\"additionalProperties\":false}");

    (void)state;
    assert_string_equal(t->name, "get_time");
    assert_true(strlen(t->description) > 20);
    assert_true(json_equal((json_t *)t->parameters, want));
    /* Adding the built-ins twice is a duplicate. */
    assert_int_equal(loom_tools_add_builtins(reg), LOOM_EEXISTS);
    assert_int_equal(loom_tools_add_builtins(NULL), LOOM_EINVALID);
    json_decref(want);
    loom_tool_registry_free(reg);
}

/* The clock get_time reads: time(2) may read a coarser one that lags it
 * by a tick, which at a second's turn puts "after" before the answer. */
static time_t realtime_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

static void test_get_time_utc(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    time_t before = realtime_s(), after;
    int64_t unix_time;
    char *out = NULL;

    (void)state;
    assert_int_equal(run_get_time(t, "{}", NULL, &out), 0);
    after = realtime_s();
    unix_time = check_result(out, "UTC", "+00:00");
    assert_true(unix_time >= before && unix_time <= after);
    free(out);
    /* No arguments at all, and an explicit "UTC", mean the same. */
    assert_int_equal(run_get_time(t, NULL, NULL, &out), 0);
    check_result(out, "UTC", "+00:00");
    free(out);
    assert_int_equal(run_get_time(t, "{\"timezone\":\"UTC\"}", NULL, &out),
                     0);
    check_result(out, "UTC", "+00:00");
    free(out);
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Etc/UTC\"}", NULL,
                                  &out), 0);
    check_result(out, "Etc/UTC", "+00:00");
    free(out);
    loom_tool_registry_free(reg);
}

/* get_time in zone, checked against glibc for the returned instant. */
static void check_zone_against_glibc(const loom_tool *t, const char *zone)
{
    char args[128], *out = NULL, offset[16], iso[64], want_iso[96];
    json_t *r;
    time_t unix_time;
    struct tm tm;

    snprintf(args, sizeof(args), "{\"timezone\":\"%s\"}", zone);
    assert_int_equal(run_get_time(t, args, NULL, &out), 0);
    r = parse(out);
    unix_time = (time_t)json_integer_value(json_object_get(r, "unix"));
    set_tz(zone);
    assert_non_null(localtime_r(&unix_time, &tm));
    set_tz(NULL);
    offset_text(tm.tm_gmtoff, offset, sizeof(offset));
    check_result(out, zone, offset);
    strftime(iso, sizeof(iso), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(want_iso, sizeof(want_iso), "%s%s", iso, offset);
    assert_string_equal(json_string_value(json_object_get(r, "iso")),
                        want_iso);
    assert_string_equal(json_string_value(json_object_get(r, "weekday")),
                        weekday_names[tm.tm_wday]);
    json_decref(r);
    free(out);
}

static void test_get_time_zones(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    char *out = NULL;

    (void)state;
    check_zone_against_glibc(t, "Europe/Paris");
    check_zone_against_glibc(t, "America/New_York");
    check_zone_against_glibc(t, "Australia/Sydney");
    check_zone_against_glibc(t, "America/St_Johns");
    /* Zones without DST have fixed, known offsets. */
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Asia/Kolkata\"}",
                                  NULL, &out), 0);
    check_result(out, "Asia/Kolkata", "+05:30");
    free(out);
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Asia/Tokyo\"}", NULL,
                                  &out), 0);
    check_result(out, "Asia/Tokyo", "+09:00");
    free(out);
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Asia/Kathmandu\"}",
                                  NULL, &out), 0);
    check_result(out, "Asia/Kathmandu", "+05:45");
    free(out);
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Pacific/Honolulu\"}",
                                  NULL, &out), 0);
    check_result(out, "Pacific/Honolulu", "-10:00");
    free(out);
    loom_tool_registry_free(reg);
}

static void test_get_time_default_from_settings(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    const char *tokyo = "{\"default_timezone\":\"Asia/Tokyo\"}";
    char *out = NULL;

    (void)state;
    assert_int_equal(run_get_time(t, "{}", tokyo, &out), 0);
    check_result(out, "Asia/Tokyo", "+09:00");
    free(out);
    /* "" means no preference: the default applies. */
    assert_int_equal(run_get_time(t, "{\"timezone\":\"\"}", tokyo, &out), 0);
    check_result(out, "Asia/Tokyo", "+09:00");
    free(out);
    /* The model's choice wins over the default. */
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Asia/Kolkata\"}",
                                  tokyo, &out), 0);
    check_result(out, "Asia/Kolkata", "+05:30");
    free(out);
    /* Settings without the key, or an empty one, mean UTC. */
    assert_int_equal(run_get_time(t, "{}", "{\"other\":1}", &out), 0);
    check_result(out, "UTC", "+00:00");
    free(out);
    assert_int_equal(run_get_time(t, "{}", "{\"default_timezone\":\"\"}",
                                  &out), 0);
    check_result(out, "UTC", "+00:00");
    free(out);
    assert_int_equal(run_get_time(t, "{}", "{\"default_timezone\":5}", &out),
                     LOOM_EINVALID);
    assert_string_equal(out, "setting default_timezone must be a string");
    free(out);
    assert_int_equal(run_get_time(t, "{}",
                                  "{\"default_timezone\":\"Mars/Olympus\"}",
                                  &out), LOOM_ENOTFOUND);
    assert_string_equal(out, UNKNOWN_MARS);
    free(out);
    loom_tool_registry_free(reg);
}

static void test_get_time_bad_zone(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    char *out = NULL;
    json_t *args = json_pack("{s:i}", "timezone", 5);
    loom_buf buf = LOOM_BUF_INIT(1024);

    (void)state;
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Mars/Olympus\"}", NULL,
                                  &out), LOOM_ENOTFOUND);
    assert_string_equal(out, UNKNOWN_MARS);
    assert_string_equal(loom_error_last(), UNKNOWN_MARS);
    free(out);
    /* A file that exists but is not TZif data is no zone either. */
    assert_int_equal(run_get_time(t, "{\"timezone\":\"leapseconds\"}", NULL,
                                  &out), LOOM_ENOTFOUND);
    assert_string_equal(out, "unknown timezone 'leapseconds'; use an IANA "
                             "name like Europe/Paris");
    free(out);
    /* A directory is not a zone. */
    assert_int_equal(run_get_time(t, "{\"timezone\":\"Europe\"}", NULL,
                                  &out), LOOM_ENOTFOUND);
    free(out);
    /* Called directly with a wrong type (no validation): still safe. */
    assert_int_equal(t->execute(args, NULL, &buf, NULL), LOOM_EINVALID);
    assert_string_equal(loom_buf_cstr(&buf), "`timezone` must be a string");
    loom_buf_free(&buf);
    json_decref(args);
    loom_tool_registry_free(reg);
}

static void test_get_time_output_limit(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    loom_buf small = LOOM_BUF_INIT(16);

    (void)state;
    assert_int_equal(t->execute(NULL, NULL, &small, NULL), LOOM_ETOOLARGE);
    loom_buf_free(&small);
    loom_tool_registry_free(reg);
}

static void test_zone_names_rejected(void **state)
{
    static const char *const bad[] = {
        "../../etc/passwd", "/etc/passwd", "Europe/../../../etc/passwd",
        "Europe/Paris/..", "..", "Europe/./Paris", "Europe\\Paris",
        "Europe/Paris\n", "Europe/Paris ", "Europe/Paris%00", "~root",
        "", "Europe/Par\xc3\xads",
    };
    char name[200];
    int32_t off = 12345;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(loom__tz_offset(bad[i], 0, &off), LOOM_EINVALID);
        assert_int_equal(off, 12345);
    }
    assert_string_equal(loom_error_last(),
                        "unknown timezone 'Europe/Par\xc3\xads'; use an "
                        "IANA name like Europe/Paris");
    assert_int_equal(loom__tz_offset(NULL, 0, &off), LOOM_EINVALID);

    /* 128 characters is the longest name looked up; 129 is refused. */
    memset(name, 'A', 128);
    name[128] = '\0';
    assert_int_equal(loom__tz_offset(name, 0, &off), LOOM_ENOTFOUND);
    name[128] = 'A';
    name[129] = '\0';
    assert_int_equal(loom__tz_offset(name, 0, &off), LOOM_EINVALID);
    /* The message shows at most 64 characters of the name. */
    assert_int_equal(strlen(loom_error_last()),
                     strlen("unknown timezone ''; use an IANA name like "
                            "Europe/Paris") + 64);
}

/* ---- the offset computation, against glibc over many instants */

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *data;
    long n;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    data = malloc((size_t)n);
    assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return data;
}

#define YEAR 31556952LL
#define T1902 (-2145916800LL)
#define T2100 (4102444800LL)

typedef int (*offset_fn)(const void *ctx, int64_t t, int32_t *utoff);

/*
 * Compares an offset function with glibc (for the zone in TZ) from `from`
 * to `to` every `step` seconds, and to the second on both sides of every
 * change glibc shows between two samples.
 */
static void compare_range(const char *label, offset_fn fn, const void *ctx,
                          int64_t from, int64_t to, int64_t step)
{
    int64_t prev_t = from;
    long prev = glibc_offset(from);
    int32_t ours;

    for (int64_t t = from; t < to; t += step) {
        long want = glibc_offset(t);

        assert_int_equal(fn(ctx, t, &ours), 0);
        if (ours != want)
            fail_msg("%s at %lld: ours %d, glibc %ld", label, (long long)t,
                     ours, want);
        if (want != prev) {
            int64_t lo = prev_t, hi = t;

            while (hi - lo > 1) {
                int64_t mid = lo + (hi - lo) / 2;

                if (glibc_offset(mid) == prev)
                    lo = mid;
                else
                    hi = mid;
            }
            assert_int_equal(fn(ctx, lo, &ours), 0);
            if (ours != glibc_offset(lo))
                fail_msg("%s just before the change at %lld: ours %d", label,
                         (long long)hi, ours);
            assert_int_equal(fn(ctx, hi, &ours), 0);
            if (ours != glibc_offset(hi))
                fail_msg("%s at the change at %lld: ours %d", label,
                         (long long)hi, ours);
        }
        prev = want;
        prev_t = t;
    }
}

typedef struct {
    const unsigned char *data;
    size_t len;
} tzif_data;

static int tzif_fn(const void *ctx, int64_t t, int32_t *utoff)
{
    const tzif_data *d = ctx;

    return loom__tzif_offset(d->data, d->len, t, utoff);
}

static int posix_fn(const void *ctx, int64_t t, int32_t *utoff)
{
    return loom__tz_posix_offset(ctx, t, utoff);
}

/* The same zone file read by us and by glibc, from 1902 to 2100, so both
 * the transition table and the footer rule are exercised. */
static void compare_zone(const char *zone)
{
    char path[256];
    tzif_data d;

    snprintf(path, sizeof(path), "/usr/share/zoneinfo/%s", zone);
    d.data = read_file(path, &d.len);
    set_tz(zone);
    compare_range(zone, tzif_fn, &d, T1902, T2100, 25 * 3600 + 13);
    set_tz(NULL);
    free((void *)d.data);
}

static void test_offsets_match_glibc(void **state)
{
    static const char *const zones[] = {
        "Europe/Paris", "America/New_York", "Australia/Sydney",
        "Asia/Kolkata", "Asia/Tokyo", "America/St_Johns", "Pacific/Chatham",
        "Europe/Dublin", "America/Nuuk", "Antarctica/Troll",
        "America/Santiago", "Australia/Lord_Howe", "Africa/Casablanca",
        "Asia/Tehran", "Pacific/Apia", "America/Sao_Paulo", "Europe/London",
        "Pacific/Kiritimati", "America/Godthab", "Etc/GMT+5",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(zones) / sizeof(zones[0]); i++)
        compare_zone(zones[i]);
}

/* POSIX TZ strings read by our footer parser and by glibc. */
static void compare_posix(const char *tz, int64_t from, int64_t to)
{
    set_tz(tz);
    compare_range(tz, posix_fn, tz, from, to, 25 * 3600 + 7);
    set_tz(NULL);
}

static void test_posix_strings_match_glibc(void **state)
{
    static const char *const rules[] = {
        "CET-1CEST,M3.5.0,M10.5.0/3",
        "XST5XDT,M3.2.0,M11.1.0",
        "<+1030>-10:30<+11>-11,M10.1.0,M4.1.0",
        "<-04>4<-03>,M9.1.6/24,M4.1.6/24",
        "<-02>2<-01>,M3.5.0/-1,M10.5.0/0",
        "IST-1GMT0,M10.5.0,M3.5.0/1",
        "<+1245>-12:45<+1345>,M9.5.0/2:45,M4.1.0/3:45",
        /* Julian days, with and without leap days counted. */
        "AAA3BBB,J60/1,J300/2",
        "AAA-3BBB-4,59/1,299/2",
        /* DST all year (RFC 8536's example), and a DST behind std. */
        "EST5EDT4,0/0,J365/25",
        "XXX3EDT4,0/0,J365/25",
        "<+0530>-5:30",
        "ABC+3:15:30",
    };

    (void)state;
    /* glibc applies TZ rules only from 1970 on (we apply them in any
     * year, as RFC 8536 asks, but a footer never covers the past). */
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        compare_posix(rules[i], 0, 130 * YEAR);
}

static void test_posix_edge_cases(void **state)
{
    static const char *const bad[] = {
        "", "AB5", "ABC", "ABC5DEF,M13.1.0,M11.1.0", "ABC5DEF,M3.6.0,M11.1.0",
        "ABC5DEF,M3.1.7,M11.1.0", "ABC5DEF,J0,J100", "ABC5DEF,366,1",
        "ABC5DEF,M3.2.0", "ABC5DEF,M3.2.0,M11.1.0x", "<ABC5", "<A.B>5",
        "ABC25", "ABC5DEF,M3.2.0/168,M11.1.0", "ABC5:60", "ABC1234",
    };
    int32_t off;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (loom__tz_posix_offset(bad[i], 0, &off) != LOOM_EPROTO)
            fail_msg("'%s' was accepted", bad[i]);
    /* DST without a rule uses the US rules. 2025-01-15 and 2025-07-15. */
    assert_int_equal(loom__tz_posix_offset("ABC5DEF", 1736899200, &off), 0);
    assert_int_equal(off, -5 * 3600);
    assert_int_equal(loom__tz_posix_offset("ABC5DEF", 1752537600, &off), 0);
    assert_int_equal(off, -4 * 3600);
    /* Time of day up to 167 hours is allowed (RFC 8536). */
    assert_int_equal(
        loom__tz_posix_offset("ABC5DEF,M3.2.0/167,M11.1.0", 0, &off), 0);
}

/* ---- TZif robustness */

static void test_tzif_truncated_and_corrupted(void **state)
{
    size_t len;
    unsigned char *data = read_file("/usr/share/zoneinfo/Europe/Paris", &len);
    int32_t off;
    const int64_t t = 1780000000; /* June 2026 */

    (void)state;
    assert_int_equal(loom__tzif_offset(data, len, t, &off), 0);
    assert_int_equal(off, 7200);
    /* Every truncation fails cleanly (an exact-size copy, for ASan). */
    for (size_t n = 0; n < len; n++) {
        unsigned char *cut = malloc(n ? n : 1);

        memcpy(cut, data, n);
        if (loom__tzif_offset(cut, n, t, &off) == 0)
            fail_msg("accepted %zu of %zu bytes", n, len);
        free(cut);
    }
    /* Flipped bits anywhere: any answer, but no crash or over-read. */
    for (size_t i = 0; i < len; i++) {
        unsigned char *copy = malloc(len);

        memcpy(copy, data, len);
        copy[i] ^= (unsigned char)(0x80 >> (i % 8)) | 0x01;
        loom__tzif_offset(copy, len, t, &off);
        loom__tzif_offset(copy, len, INT64_MIN, &off);
        loom__tzif_offset(copy, len, INT64_MAX / 2, &off);
        free(copy);
    }
    free(data);
    assert_int_equal(loom__tzif_offset(NULL, 0, t, &off), LOOM_ENOTFOUND);
    assert_int_equal(loom__tzif_offset((const unsigned char *)"hello", 5, t,
                                       &off), LOOM_ENOTFOUND);
}

/* Builds a TZif file by hand. */
typedef struct {
    unsigned char b[4096];
    size_t n;
} tzbuf;

static void put8(tzbuf *z, unsigned v)
{
    z->b[z->n++] = (unsigned char)v;
}

static void put32(tzbuf *z, uint32_t v)
{
    for (int i = 3; i >= 0; i--)
        put8(z, (v >> (i * 8)) & 0xff);
}

static void put64(tzbuf *z, int64_t v)
{
    put32(z, (uint32_t)((uint64_t)v >> 32));
    put32(z, (uint32_t)v);
}

static void put_header(tzbuf *z, char version, uint32_t timecnt,
                       uint32_t typecnt, uint32_t charcnt)
{
    memcpy(z->b + z->n, "TZif", 4);
    z->n += 4;
    put8(z, (unsigned char)version);
    for (int i = 0; i < 15; i++)
        put8(z, 0);
    put32(z, 0); /* isutcnt */
    put32(z, 0); /* isstdcnt */
    put32(z, 0); /* leapcnt */
    put32(z, timecnt);
    put32(z, typecnt);
    put32(z, charcnt);
}

/* One transition at `at` from type 0 (utoff0) to type 1 (utoff1). */
static void put_block(tzbuf *z, int tsize, int64_t at, int32_t utoff0,
                      int32_t utoff1)
{
    if (tsize == 8)
        put64(z, at);
    else
        put32(z, (uint32_t)at);
    put8(z, 1);
    put32(z, (uint32_t)utoff0);
    put8(z, 0);
    put8(z, 0);
    put32(z, (uint32_t)utoff1);
    put8(z, 0);
    put8(z, 4);
    memcpy(z->b + z->n, "AAA\0BBB\0", 8);
    z->n += 8;
}

static void test_tzif_synthetic(void **state)
{
    tzbuf z = {{0}, 0};
    int32_t off;
    char footer[400];

    (void)state;
    /* Version 1: 32-bit times, no footer. */
    put_header(&z, 0, 1, 2, 8);
    put_block(&z, 4, 1000, 3600, -1800);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 999, &off), 0);
    assert_int_equal(off, 3600);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 1000, &off), 0);
    assert_int_equal(off, -1800);
    assert_int_equal(loom__tzif_offset(z.b, z.n, INT64_MAX, &off), 0);
    assert_int_equal(off, -1800);

    /* Version 2: the 64-bit block and the footer rule after the table. */
    z.n = 0;
    put_header(&z, '2', 1, 2, 8);
    put_block(&z, 4, 1000, 3600, 7200);
    put_header(&z, '2', 1, 2, 8);
    put_block(&z, 8, 5000000000LL, 3600, 7200);
    memcpy(z.b + z.n, "\n<+05>-5\n", 9);
    z.n += 9;
    assert_int_equal(loom__tzif_offset(z.b, z.n, 4999999999LL, &off), 0);
    assert_int_equal(off, 3600);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 5000000000LL, &off), 0);
    assert_int_equal(off, 7200);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 5000000001LL, &off), 0);
    assert_int_equal(off, 5 * 3600);

    /* An empty footer: the last type stays in force. */
    z.n -= 9;
    memcpy(z.b + z.n, "\n\n", 2);
    z.n += 2;
    assert_int_equal(loom__tzif_offset(z.b, z.n, 6000000000LL, &off), 0);
    assert_int_equal(off, 7200);

    /* A footer of 255 bytes is read; 256 is refused. */
    z.n -= 2;
    footer[0] = '\n';
    memset(footer + 1, 'A', 253);
    memcpy(footer + 254, "-5\n", 3);
    memcpy(z.b + z.n, footer, 257);
    assert_int_equal(loom__tzif_offset(z.b, z.n + 257, 6000000000LL, &off),
                     0);
    assert_int_equal(off, 5 * 3600);
    memset(footer + 1, 'A', 254);
    memcpy(footer + 255, "-5\n", 3);
    memcpy(z.b + z.n, footer, 258);
    assert_int_equal(loom__tzif_offset(z.b, z.n + 258, 6000000000LL, &off),
                     LOOM_EPROTO);
    assert_string_equal(loom_error_last(), "malformed TZif data");

    /* Huge counts must not overflow the size arithmetic. */
    z.n = 0;
    put_header(&z, 0, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    put_block(&z, 4, 1000, 0, 0);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 0, &off), LOOM_EPROTO);
    /* No types at all. */
    z.n = 0;
    put_header(&z, 0, 0, 0, 0);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 0, &off), LOOM_EPROTO);
    /* A transition to a type that does not exist. */
    z.n = 0;
    put_header(&z, 0, 1, 2, 8);
    put_block(&z, 4, 1000, 0, 0);
    z.b[44 + 4] = 7;
    assert_int_equal(loom__tzif_offset(z.b, z.n, 2000, &off), LOOM_EPROTO);
    /* The one offset RFC 8536 forbids. */
    z.n = 0;
    put_header(&z, 0, 1, 2, 8);
    put_block(&z, 4, 1000, 0, INT32_MIN);
    assert_int_equal(loom__tzif_offset(z.b, z.n, 2000, &off), LOOM_EPROTO);
}

/* A scratch zoneinfo directory, for file-level limits. */
static void test_zone_files(void **state)
{
    const char *base = getenv("LOOM_TEST_TMP");
    char dir[PATH_MAX], path[PATH_MAX + 32];
    size_t len;
    unsigned char *paris = read_file("/usr/share/zoneinfo/Europe/Paris",
                                     &len);
    unsigned char *big;
    FILE *f;
    int32_t off;

    (void)state;
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0700);
    snprintf(dir, sizeof(dir), "%s/loom-tz-XXXXXX", base);
    assert_non_null(mkdtemp(dir));

    /* A good zone under the scratch directory is read from there. */
    snprintf(path, sizeof(path), "%s/Good", dir);
    f = fopen(path, "wb");
    fwrite(paris, 1, len, f);
    fclose(f);
    assert_int_equal(loom__tz_offset_in(dir, "Good", 1780000000, &off), 0);
    assert_int_equal(off, 7200);

    /* 256 KiB is the largest file read: pad a real file up to it. */
    big = calloc(1, 256 * 1024 + 1);
    memcpy(big, paris, len);
    snprintf(path, sizeof(path), "%s/Big", dir);
    f = fopen(path, "wb");
    fwrite(big, 1, 256 * 1024, f);
    fclose(f);
    /* Trailing bytes after the footer are ignored. */
    assert_int_equal(loom__tz_offset_in(dir, "Big", 1780000000, &off), 0);
    assert_int_equal(off, 7200);
    f = fopen(path, "wb");
    fwrite(big, 1, 256 * 1024 + 1, f);
    fclose(f);
    assert_int_equal(loom__tz_offset_in(dir, "Big", 1780000000, &off),
                     LOOM_ENOTFOUND);

    /* Corrupt TZif data is reported as such, naming the zone. */
    snprintf(path, sizeof(path), "%s/Cut", dir);
    f = fopen(path, "wb");
    fwrite(paris, 1, len - 5, f);
    fclose(f);
    assert_int_equal(loom__tz_offset_in(dir, "Cut", 1780000000, &off),
                     LOOM_EPROTO);
    assert_string_equal(loom_error_last(),
                        "timezone data for 'Cut' is corrupt");

    /* A file too small to be TZif. */
    snprintf(path, sizeof(path), "%s/Tiny", dir);
    f = fopen(path, "wb");
    fputs("TZif", f);
    fclose(f);
    assert_int_equal(loom__tz_offset_in(dir, "Tiny", 0, &off),
                     LOOM_ENOTFOUND);

    snprintf(path, sizeof(path), "%s/Good", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/Big", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/Cut", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/Tiny", dir);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
    free(big);
    free(paris);
}

/* ---- threads */

#define NTHREADS 8
#define ROUNDS 200

static const struct {
    const char *zone;
    const char *offset;
} fixed_zones[NTHREADS] = {
    {"UTC", "+00:00"},           {"Asia/Kolkata", "+05:30"},
    {"Asia/Tokyo", "+09:00"},    {"Asia/Kathmandu", "+05:45"},
    {"Asia/Shanghai", "+08:00"}, {"America/Phoenix", "-07:00"},
    {"Pacific/Honolulu", "-10:00"}, {"Africa/Lagos", "+01:00"},
};

/* Instants, and glibc's answers for them, computed before threads run. */
#define NSAMPLES 6
static const int64_t sample_times[NSAMPLES] = {
    1735689600, 1743296400, 1743296399, 1752537600, 1761440400, 1900000000,
};
static const char *const dst_zones[2] = {"Europe/Paris", "America/New_York"};
static long expected[2][NSAMPLES];

typedef struct {
    const loom_tool *tool;
    int index;
    int failures;
    char first_failure[256];
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    loom_cancel cancel = LOOM_CANCEL_INIT;
    loom_tool_ctx ctx = {
        .call_id = "call", .tool_name = "get_time", .cancel = &cancel};
    json_t *args = json_pack("{s:s}", "timezone", fixed_zones[a->index].zone);

    for (int r = 0; r < ROUNDS; r++) {
        loom_buf out = LOOM_BUF_INIT(4096);
        json_t *res;
        const char *got;
        int32_t off;
        int z = (a->index + r) % 2, s = r % NSAMPLES;

        if (a->tool->execute(args, &ctx, &out, NULL) != 0) {
            a->failures++;
            snprintf(a->first_failure, sizeof(a->first_failure), "%s",
                     loom_buf_cstr(&out));
        } else {
            res = json_loads(loom_buf_cstr(&out), 0, NULL);
            got = json_string_value(json_object_get(res, "utc_offset"));
            if (!got || strcmp(got, fixed_zones[a->index].offset) != 0) {
                a->failures++;
                snprintf(a->first_failure, sizeof(a->first_failure),
                         "%s: %s", fixed_zones[a->index].zone,
                         loom_buf_cstr(&out));
            }
            json_decref(res);
        }
        loom_buf_free(&out);
        if (loom__tz_offset(dst_zones[z], sample_times[s], &off) != 0 ||
            off != expected[z][s]) {
            a->failures++;
            snprintf(a->first_failure, sizeof(a->first_failure),
                     "%s at %lld", dst_zones[z], (long long)sample_times[s]);
        }
    }
    json_decref(args);
    return NULL;
}

static void test_get_time_threads(void **state)
{
    loom_tool_registry *reg = NULL;
    const loom_tool *t = get_time_tool(&reg);
    pthread_t th[NTHREADS];
    thread_arg args[NTHREADS];

    (void)state;
    for (int z = 0; z < 2; z++) {
        set_tz(dst_zones[z]);
        for (int s = 0; s < NSAMPLES; s++)
            expected[z][s] = glibc_offset(sample_times[s]);
        set_tz(NULL);
    }
    /* The samples straddle DST changes, so both offsets occur. */
    assert_int_not_equal(expected[0][1], expected[0][2]);
    for (int i = 0; i < NTHREADS; i++) {
        memset(&args[i], 0, sizeof(args[i]));
        args[i].tool = t;
        args[i].index = i;
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]),
                         0);
    }
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < NTHREADS; i++)
        if (args[i].failures)
            fail_msg("thread %d: %d failures, first: %s", i,
                     args[i].failures, args[i].first_failure);
    loom_tool_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_basics),
        cmocka_unit_test(test_registry_copies_strings),
        cmocka_unit_test(test_registry_duplicate_refused),
        cmocka_unit_test(test_registry_bad_names),
        cmocka_unit_test(test_registry_needs_execute_and_object_schema),
        cmocka_unit_test(test_registry_remove),
        cmocka_unit_test(test_registry_clear),
        cmocka_unit_test(test_registry_many_tools),
        cmocka_unit_test(test_registry_payload_freed_once),
        cmocka_unit_test(test_registry_sources),
        cmocka_unit_test(test_registry_parameters_refcount),
        cmocka_unit_test(test_get_time_registered),
        cmocka_unit_test(test_get_time_utc),
        cmocka_unit_test(test_get_time_zones),
        cmocka_unit_test(test_get_time_default_from_settings),
        cmocka_unit_test(test_get_time_bad_zone),
        cmocka_unit_test(test_get_time_output_limit),
        cmocka_unit_test(test_zone_names_rejected),
        cmocka_unit_test(test_offsets_match_glibc),
        cmocka_unit_test(test_posix_strings_match_glibc),
        cmocka_unit_test(test_posix_edge_cases),
        cmocka_unit_test(test_tzif_truncated_and_corrupted),
        cmocka_unit_test(test_tzif_synthetic),
        cmocka_unit_test(test_zone_files),
        cmocka_unit_test(test_get_time_threads),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
