/* metrics_parse_address (see metrics.h), apart from the endpoint so that the config reader (common/config.c)
 * and its fuzz target link it without libmicrohttpd. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/metrics.h"

int metrics_parse_address(const char *address, char *host, size_t hostlen, int *port)
{
    if (!address)
        return pf_err(-EINVAL, "metrics_address: none given");
    const char *colon = strrchr(address, ':');
    const char *h = address, *p = colon ? colon + 1 : address;
    size_t hl = colon ? (size_t)(colon - address) : 0;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
        if (hl == 0)
            return pf_err(-EINVAL, "metrics_address '%s': empty brackets", address);
    } else if (hl > 0 && memchr(h, ':', hl)) {
        return pf_err(-EINVAL, "metrics_address '%s': an IPv6 address needs brackets: [addr]:port", address);
    }
    if (hl >= hostlen)
        return pf_err(-EINVAL, "metrics_address '%s': host too long", address);
    for (size_t i = 0; i < hl; i++) {
        char ch = h[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '-' || ch == '_' || ch == ':' || ch == '%'))
            return pf_err(-EINVAL, "metrics_address '%s': host contains '%c' (a host name, IPv4 or [IPv6] address "
                          "expected)", address, ch);
    }
    long v = 0;
    int digits = 0;
    for (; *p; p++, digits++) {
        if (*p < '0' || *p > '9' || digits >= 5)
            return pf_err(-EINVAL, "metrics_address '%s': port must be a number in 0-65535 (host:port)", address);
        v = v * 10 + (*p - '0');
    }
    if (!digits || v > 65535)
        return pf_err(-EINVAL, "metrics_address '%s': port must be a number in 0-65535 (host:port)", address);
    if (hl)
        memcpy(host, h, hl);
    else
        snprintf(host, hostlen, "127.0.0.1");
    if (hl)
        host[hl] = '\0';
    *port = (int)v;
    return 0;
}
