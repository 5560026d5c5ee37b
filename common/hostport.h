/* "host:port" addresses as the config key `rendezvous` gives them: a host name, an IPv4 address or a
 * bracketed IPv6 address ("[::1]:7000"), then a TCP port. */
#ifndef PFCPS_COMMON_HOSTPORT_H
#define PFCPS_COMMON_HOSTPORT_H

#include <stddef.h>

/* Splits "host:port" into host (hostlen bytes, NUL-terminated; brackets of an IPv6 address removed) and
 * *port in 1-65535. Returns 0, or -EINVAL with pf_errmsg() naming the problem (no colon, empty or too long
 * host, a character no host name or address has, bad port). */
int pf_parse_hostport(const char *hp, char *host, size_t hostlen, int *port);

#endif
