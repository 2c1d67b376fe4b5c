/*
 * Runs a cmocka test body on a fiber (core/fiber.h), so that a suite can
 * check that code behaves the same on a fiber as on a plain thread.
 */
#ifndef LOOM_TEST_ON_FIBER_H
#define LOOM_TEST_ON_FIBER_H

/* Runs test(state) on a fiber of a one-worker scheduler and returns when
 * it has returned and the scheduler has stopped. */
void test_on_fiber(void (*test)(void **state), void **state);

/* Defines name_on_fiber, a test that runs name on a fiber. */
#define TEST_ON_FIBER(name)                                                    \
    static void name##_on_fiber(void **state)                                  \
    {                                                                          \
        test_on_fiber(name, state);                                            \
    }

#endif
