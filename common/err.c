#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char errbuf[PF_ERRMSG_MAX];

int pf_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return code;
}

int pf_err_wrap(int code, const char *fmt, ...)
{
    char prefix[PF_ERRMSG_MAX], old[PF_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errbuf, sizeof old);
    const char *rest = old[0] ? old : strerror(code < 0 ? -code : code);
    size_t n = strnlen(prefix, sizeof errbuf - 3);
    memcpy(errbuf, prefix, n);
    memcpy(errbuf + n, ": ", 2);
    snprintf(errbuf + n + 2, sizeof errbuf - n - 2, "%s", rest);
    return code;
}

const char *pf_errmsg(void)
{
    return errbuf;
}

void pf_err_clear(void)
{
    errbuf[0] = '\0';
}
