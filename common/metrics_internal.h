/* What metrics.c (the registry) and metrics_http.c (the endpoint) share, beyond metrics.h. */
#ifndef PFCPS_COMMON_METRICS_INTERNAL_H
#define PFCPS_COMMON_METRICS_INTERNAL_H

#include <stddef.h>

/* v as the exposition format reads it, into out[n] (n >= 32): "NaN", "+Inf", "-Inf", an integer below 1e15
 * without exponent or decimals, else the shortest %g text that strtod reads back to v. */
void metrics_format_value(double v, char *out, size_t n);

/* Drops the pages of metrics_add_page (metrics_reset). */
void metrics_pages_reset(void);

#endif
