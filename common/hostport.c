/* Parsing and resolving "host:port" (see hostport.h). */
#include "common/hostport.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

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

static const volatile sig_atomic_t *g_resolve_interrupt;

void pf_resolve_set_interrupt(const volatile sig_atomic_t *flag)
{
    g_resolve_interrupt = flag;
}

/* Answers that may change once the name is published (or the resolver recovers). */
static int resolve_retryable(int gr)
{
    switch (gr) {
    case EAI_NONAME:
    case EAI_AGAIN:
    case EAI_FAIL:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
        return 1;
    default: return 0;
    }
}

static const char *resolve_reason(int gr, int err)
{
    return gr == EAI_SYSTEM ? strerror(err) : gai_strerror(gr);
}

int pf_resolve(const char *what, const char *host, const char *port, const struct addrinfo *hints,
               double deadline, struct addrinfo **out)
{
    *out = NULL;
    double start = pf_now_s(), next_log = start;
    for (;;) {
        int gr = getaddrinfo(host, port, hints, out);
        if (gr == 0) {
            if (next_log > start) /* logged a wait: say that it ended */
                log_info("name '%s' resolved after %.1f s", host, pf_now_s() - start);
            return 0;
        }
        *out = NULL;
        int err = errno;
        double now = pf_now_s();
        if (!resolve_retryable(gr) || now + PF_RESOLVE_RETRY_S > deadline) {
            if (now - start < PF_RESOLVE_RETRY_S)
                return pf_err(-EINVAL, "cannot resolve %s '%s': %s", what, host, resolve_reason(gr, err));
            return pf_err(-EINVAL, "cannot resolve %s '%s': %s (retried for %.1f s)", what, host,
                          resolve_reason(gr, err), now - start);
        }
        if (now >= next_log) {
            log_warn("waiting for name '%s' (%s) to resolve: %s; retrying for up to %.1f s more", host, what,
                     gai_strerror(gr), deadline - now);
            next_log = now + PF_RESOLVE_LOG_S;
        }
        /* Sleep PF_RESOLVE_RETRY_S in ticks of 0.1 s so that a stop request ends the wait at once. */
        for (double until = now + PF_RESOLVE_RETRY_S; pf_now_s() < until;) {
            if (g_resolve_interrupt && *g_resolve_interrupt)
                return pf_err(-EINTR, "interrupted (SIGTERM/SIGINT) while waiting for name '%s' to resolve",
                              host);
            poll(NULL, 0, 100);
        }
    }
}

int pf_route_source(const char *host, int port, double deadline, char *out, size_t n)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
    struct addrinfo *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = pf_resolve("the rendezvous host", host, ps, &hints, deadline, &ai);
    if (rc < 0)
        return rc;
    rc = -EHOSTUNREACH;
    for (struct addrinfo *a = ai; a && rc < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0)
            rc = 0;
        close(fd);
    }
    freeaddrinfo(ai);
    if (rc < 0)
        return pf_err(rc, "no route from this host to the rendezvous %s:%d", host, port);
    return 0;
}
