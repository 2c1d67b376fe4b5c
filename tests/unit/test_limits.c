/*
 * Unit tests of the limiter (loom/limits.h) with its spend in a SQLite
 * store: requests and tokens per minute over a sliding minute (and what
 * the headers are made from), concurrent runs, budget reservations all
 * or none over several scopes, settling to the real cost, models without
 * prices, budget periods, the spend surviving a new limiter on the same
 * store, and 8 threads racing for a budget of exactly 10 calls. Time is
 * given by hand: nothing waits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/limits.h"
#include "store_fixture.h"
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* 2026-03-15T12:00:00Z */
#define NOW 1773576000000LL
#define DAY_MS 86400000LL

static char *g_path;
static loom_store *g_st;
static loom_limiter *g_l;

static int setup(void **state)
{
    (void)state;
    g_path = test_db_path("limits.db");
    g_st = test_store_open_ok(g_path);
    assert_int_equal(loom_limiter_new(&g_l, g_st), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    loom_limiter_free(g_l);
    loom_store_free(g_st);
    test_db_remove(g_path);
    free(g_path);
    return 0;
}

static loom_limit_scope scope(const char *name, loom_limits l)
{
    loom_limit_scope s = {name, l};
    return s;
}

/* Admits at now; returns the lease (NULL when refused, *why says). */
static loom_limit_lease *admit(const loom_limit_scope *sc, size_t n,
                               int64_t now, loom_limit_status *st)
{
    loom_limit_lease *lease = NULL;

    assert_int_equal(loom_limiter_admit(g_l, sc, n, now, st, &lease), 0);
    assert_true((lease == NULL) == (st->refused != LOOM_LIMIT_OK));
    return lease;
}

static void test_requests_per_minute(void **state)
{
    loom_limit_scope sc = scope("key:a", (loom_limits){.rpm = 3});
    loom_limit_lease *ls[3];
    loom_limit_status st;

    (void)state;
    for (int i = 0; i < 3; i++) {
        ls[i] = admit(&sc, 1, NOW + i * 1000, &st);
        assert_non_null(ls[i]);
        assert_int_equal(st.requests_limit, 3);
        assert_int_equal(st.requests_remaining, 2 - i);
        loom_limiter_release(g_l, ls[i]);
    }
    assert_null(admit(&sc, 1, NOW + 2500, &st));
    assert_int_equal(st.refused, LOOM_LIMIT_REQUESTS);
    assert_int_equal(st.requests_remaining, 0);
    /* The first request leaves the window at NOW + 60 s. */
    assert_int_equal(st.retry_after_ms, 60000 - 2500);
    assert_null(admit(&sc, 1, NOW + 59999, &st));
    ls[0] = admit(&sc, 1, NOW + 60000, &st);
    assert_non_null(ls[0]);
    loom_limiter_release(g_l, ls[0]);
}

/* A refused request counts in no scope. */
static void test_all_or_none(void **state)
{
    loom_limit_scope sc[2] = {scope("key:b", (loom_limits){.rpm = 5}),
                              scope("workspace:w", (loom_limits){.rpm = 1})};
    loom_limit_lease *ls;
    loom_limit_status st;

    (void)state;
    ls = admit(sc, 2, NOW, &st);
    assert_non_null(ls);
    /* The headers speak of the scope with the fewest left. */
    assert_int_equal(st.requests_limit, 1);
    assert_int_equal(st.requests_remaining, 0);
    loom_limiter_release(g_l, ls);
    for (int i = 0; i < 3; i++) {
        assert_null(admit(sc, 2, NOW, &st));
        assert_int_equal(st.scope, 1);
    }
    /* key:b counted one request only. */
    ls = admit(sc, 1, NOW, &st);
    assert_int_equal(st.requests_remaining, 3);
    loom_limiter_release(g_l, ls);
}

static void test_concurrent_runs(void **state)
{
    loom_limit_scope sc = scope("user:w/c", (loom_limits){.max_concurrent = 2});
    loom_limit_lease *a, *b;
    loom_limit_status st;

    (void)state;
    a = admit(&sc, 1, NOW, &st);
    b = admit(&sc, 1, NOW, &st);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(admit(&sc, 1, NOW, &st));
    assert_int_equal(st.refused, LOOM_LIMIT_CONCURRENT);
    loom_limiter_release(g_l, a);
    a = admit(&sc, 1, NOW, &st);
    assert_non_null(a);
    loom_limiter_release(g_l, a);
    loom_limiter_release(g_l, b);
}

static void test_tokens_per_minute(void **state)
{
    loom_limit_scope sc = scope("key:t", (loom_limits){.tpm = 100});
    loom_limit_reservation *res;
    loom_limit_lease *ls;
    loom_limit_status st;

    (void)state;
    ls = admit(&sc, 1, NOW, &st);
    assert_int_equal(st.tokens_remaining, 100);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 10, &st, &res), 0);
    assert_non_null(res);
    assert_int_equal(loom_limiter_settle(g_l, res, NOW + 1000, 7, 100), 0);
    loom_limiter_release(g_l, ls);
    assert_null(admit(&sc, 1, NOW + 2000, &st));
    assert_int_equal(st.refused, LOOM_LIMIT_TOKENS);
    assert_int_equal(st.tokens_remaining, 0);
    assert_int_equal(st.retry_after_ms, 59000);
    ls = admit(&sc, 1, NOW + 61000, &st);
    assert_non_null(ls);
    loom_limiter_release(g_l, ls);
}

/* Reserve all or none over two budgets; settle to the real cost. */
static void test_budget_reservations(void **state)
{
    loom_limit_scope sc[2] = {
        scope("key:m", (loom_limits){.budget_micros = 1000}),
        scope("user:w/m", (loom_limits){.budget_micros = 100})};
    loom_limit_reservation *r1, *r2, *r3;
    loom_limit_lease *ls;
    loom_limit_status st;
    int64_t spent;

    (void)state;
    ls = admit(sc, 2, NOW, &st);
    assert_non_null(ls);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 40, &st, &r1), 0);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 40, &st, &r2), 0);
    assert_non_null(r2);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 40, &st, &r3), 0);
    assert_null(r3);
    assert_int_equal(st.refused, LOOM_LIMIT_BUDGET);
    assert_int_equal(st.scope, 1);
    assert_int_equal(st.budget_micros, 100);
    assert_true(st.exhausted_first);
    /* A refusal reserved nothing anywhere: the key's budget still has
     * room for another 920. */
    assert_int_equal(loom_limiter_settle(g_l, r1, NOW, 10, 5), 0);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 50, &st, &r3), 0);
    assert_non_null(r3);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 1, &st, &r1), 0);
    assert_null(r1);
    assert_false(st.exhausted_first);
    assert_int_equal(loom_limiter_settle(g_l, r2, NOW, 40, 5), 0);
    assert_int_equal(loom_limiter_settle(g_l, r3, NOW, 50, 5), 0);
    loom_limiter_release(g_l, ls);
    assert_int_equal(
        loom_store_spend_get(g_st, "user:w/m", LOOM_BUDGET_TOTAL, 0, &spent),
        0);
    assert_int_equal(spent, 100);
    assert_int_equal(
        loom_store_spend_get(g_st, "key:m", LOOM_BUDGET_TOTAL, 0, &spent), 0);
    assert_int_equal(spent, 100);
    /* Used up: refused at admission too, and a new limiter on the same
     * store knows it. */
    assert_null(admit(&sc[1], 1, NOW, &st));
    assert_int_equal(st.refused, LOOM_LIMIT_BUDGET);
    loom_limiter_free(g_l);
    assert_int_equal(loom_limiter_new(&g_l, g_st), 0);
    assert_null(admit(&sc[1], 1, NOW, &st));
    assert_int_equal(st.refused, LOOM_LIMIT_BUDGET);
}

static void test_unpriced(void **state)
{
    loom_limit_scope strict = scope("key:s", (loom_limits){.budget_micros = 5});
    loom_limit_scope loose = scope(
        "key:l", (loom_limits){.budget_micros = 5, .budget_allow_unpriced = 1});
    loom_limit_reservation *res;
    loom_limit_lease *ls;
    loom_limit_status st;
    int64_t spent;

    (void)state;
    ls = admit(&strict, 1, NOW, &st);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, -1, &st, &res), 0);
    assert_null(res);
    assert_int_equal(st.refused, LOOM_LIMIT_UNPRICED);
    loom_limiter_release(g_l, ls);
    ls = admit(&loose, 1, NOW, &st);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, -1, &st, &res), 0);
    assert_non_null(res);
    assert_int_equal(loom_limiter_settle(g_l, res, NOW, -1, 10), 0);
    loom_limiter_release(g_l, ls);
    assert_int_equal(
        loom_store_spend_get(g_st, "key:l", LOOM_BUDGET_TOTAL, 0, &spent), 0);
    assert_int_equal(spent, 0);
}

/* A day's budget starts afresh the next UTC day. */
static void test_periods(void **state)
{
    loom_limit_scope sc =
        scope("key:d", (loom_limits){.budget_micros = 10,
                                     .budget_period = LOOM_BUDGET_DAY});
    loom_limit_reservation *res;
    loom_limit_lease *ls;
    loom_limit_status st;

    (void)state;
    assert_int_equal(loom_budget_period_start(LOOM_BUDGET_DAY, NOW),
                     NOW - 12 * 3600000LL);
    assert_int_equal(loom_budget_period_start(LOOM_BUDGET_MONTH, NOW),
                     NOW - 12 * 3600000LL - 14 * DAY_MS);
    assert_int_equal(loom_budget_period_start(LOOM_BUDGET_TOTAL, NOW), 0);
    ls = admit(&sc, 1, NOW, &st);
    assert_int_equal(loom_limiter_reserve(g_l, ls, NOW, 10, &st, &res), 0);
    assert_int_equal(loom_limiter_settle(g_l, res, NOW, 10, 1), 0);
    loom_limiter_release(g_l, ls);
    assert_null(admit(&sc, 1, NOW, &st));
    ls = admit(&sc, 1, NOW + DAY_MS, &st);
    assert_non_null(ls);
    loom_limiter_release(g_l, ls);
}

/* ---- threads racing for one budget --------------------------------------- */

typedef struct {
    loom_limit_lease *lease;
    int granted;
} racer;

static void *race(void *arg)
{
    racer *r = arg;

    for (int i = 0; i < 50; i++) {
        loom_limit_reservation *res = NULL;
        loom_limit_status st;
        if (loom_limiter_reserve(g_l, r->lease, NOW, 100, &st, &res) != 0)
            return NULL;
        if (res) {
            r->granted++;
            if (loom_limiter_settle(g_l, res, NOW, 100, 1) != 0)
                return NULL;
        }
    }
    return NULL;
}

static void test_threads_never_overspend(void **state)
{
    loom_limit_scope sc[2] = {
        scope("key:race", (loom_limits){.budget_micros = 1000}),
        scope("workspace:race", (loom_limits){.budget_micros = 5000})};
    pthread_t th[8];
    racer rs[8];
    loom_limit_status st;
    int64_t spent;
    int total = 0;

    (void)state;
    /* Every lease first: a used-up budget admits no one. */
    for (int i = 0; i < 8; i++) {
        rs[i].granted = 0;
        rs[i].lease = admit(sc, 2, NOW, &st);
        assert_non_null(rs[i].lease);
    }
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        total += rs[i].granted;
        loom_limiter_release(g_l, rs[i].lease);
    }
    assert_int_equal(total, 10);
    assert_int_equal(
        loom_store_spend_get(g_st, "key:race", LOOM_BUDGET_TOTAL, 0, &spent),
        0);
    assert_int_equal(spent, 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_requests_per_minute, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_all_or_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_per_minute, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_budget_reservations, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unpriced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_periods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_never_overspend, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
