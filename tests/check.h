/* The soft assertion the plain-C test programs share: CHECK(cond, fmt, ...) prints the file, line and
 * message of a failed condition and counts it in `fails`; the test's main returns fails != 0 (check_summary). */
#ifndef PFCPS_TESTS_CHECK_H
#define PFCPS_TESTS_CHECK_H

#include <stdio.h>

static int fails;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                      \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
            fails++;                                                                                         \
        }                                                                                                    \
    } while (0)

/* Prints PASS or FAILED (count) and returns the test's exit status. */
static inline int check_summary(void)
{
    printf(fails ? "FAILED (%d)\n" : "PASS\n", fails);
    return fails ? 1 : 0;
}

#endif
