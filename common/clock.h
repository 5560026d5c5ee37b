/* Monotonic wall-clock seconds for timeouts, rates and progress logs (CLOCK_MONOTONIC: never steps back when
 * the system clock is set). */
#ifndef PFCPS_COMMON_CLOCK_H
#define PFCPS_COMMON_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary fixed point (boot), with nanosecond resolution. Differences only. */
static inline double pf_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
