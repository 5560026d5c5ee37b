/* Parsing "host:port" (see hostport.h). */
#include "common/hostport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int pf_parse_hostport(const char *hp, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp)
        return pf_err(-EINVAL, "'%s' is not host:port", hp);
    const char *h = hp;
    size_t hl = (size_t)(colon - hp);
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') { /* [::1]:port */
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= hostlen)
        return pf_err(-EINVAL, "'%s': host part empty or too long", hp);
    for (size_t i = 0; i < hl; i++) {
        char ch = h[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '-' || ch == '_' || ch == ':' || ch == '%'))
            return pf_err(-EINVAL, "'%s': host contains '%c' (a host name, IPv4 or [IPv6] address expected)",
                          hp, ch);
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || p < 1 || p > 65535)
        return pf_err(-EINVAL, "'%s': port must be a number in 1-65535", hp);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}
