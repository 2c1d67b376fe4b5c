/*
 * test_on_fiber: a test body on a fiber (see on_fiber.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/fiber.h"
#include "on_fiber.h"

typedef struct {
    void (*test)(void **state);
    void **state;
    int ran;
} body;

static void run(void *arg)
{
    body *b = arg;

    b->test(b->state);
    b->ran = 1;
}

void test_on_fiber(void (*test)(void **state), void **state)
{
    loom__sched_opts o = {0};
    loom__sched *s = NULL;
    body b = {test, state, 0};

    o.workers = 1;
    assert_int_equal(loom__sched_start(&s, &o), 0);
    assert_int_equal(loom__fiber_spawn(s, run, &b, 0), 0);
    loom__sched_stop(s);
    assert_true(b.ran);
}
