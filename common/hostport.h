/* "host:port" addresses as the config key `rendezvous` gives them: a host name, an IPv4 address or a
 * bracketed IPv6 address ("[::1]:7000"), then a TCP port; and resolving such a host, with retries for a name
 * that is not published yet. */
#ifndef PFCPS_COMMON_HOSTPORT_H
#define PFCPS_COMMON_HOSTPORT_H

#include <netdb.h>
#include <signal.h>
#include <stddef.h>

/* Splits "host:port" into host (hostlen bytes, NUL-terminated; brackets of an IPv6 address removed) and
 * *port in 1-65535. Returns 0, or -EINVAL with pf_errmsg() naming the problem (no colon, empty or too long
 * host, a character no host name or address has, bad port). */
int pf_parse_hostport(const char *hp, char *host, size_t hostlen, int *port);

/* getaddrinfo(host, port, hints) that waits for a name which does not resolve yet: a host name published
 * late (a Kubernetes pod's DNS record appears only once the pod runs; a hosts entry written by a launcher)
 * answers EAI_NONAME / EAI_NODATA / EAI_AGAIN / EAI_FAIL until then. Such answers are retried every
 * PF_RESOLVE_RETRY_S until `deadline` (pf_now_s() clock), with a "waiting for name '<host>' to resolve"
 * warning logged at the first failure and then at most every PF_RESOLVE_LOG_S. Other errors (bad service,
 * family, flags; out of memory) fail at once. `what` names the host in messages ("rendezvous host").
 * Returns 0 with *out (freeaddrinfo it); -EINVAL with pf_errmsg() "cannot resolve <what> '<host>': <reason>"
 * (plus how long it was retried); or -EINTR when the flag set by pf_resolve_set_interrupt is raised. */
int pf_resolve(const char *what, const char *host, const char *port, const struct addrinfo *hints,
               double deadline, struct addrinfo **out);

/* The local address this host's packets to host:port leave from (a UDP connect, nothing sent), numeric, into
 * out[n]: the interface the data plane should listen on so that the rendezvous' peers reach it. Resolves with
 * pf_resolve (retrying a name not published yet until `deadline`). Returns 0, or a negative code with
 * pf_errmsg() (unresolvable name, no route). */
int pf_route_source(const char *host, int port, double deadline, char *out, size_t n);

#define PF_RESOLVE_RETRY_S 0.5
#define PF_RESOLVE_LOG_S   5.0

/* pf_resolve stops waiting (-EINTR) once *flag is non-zero (NULL: never). The daemons set their SIGTERM/
 * SIGINT flag (daemon_signals_install). */
void pf_resolve_set_interrupt(const volatile sig_atomic_t *flag);

#endif
