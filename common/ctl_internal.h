/* What the control plane's files (ctl_frame.c, ctl_forming.c, ctl_rendezvous.c, ctl_session.c) share;
 * private to them. */
#ifndef PFCPS_COMMON_CTL_INTERNAL_H
#define PFCPS_COMMON_CTL_INTERNAL_H

#include "common/ctl.h"

/* Milliseconds between checks of the service's stop flag and of a joining member's interrupt flag. */
#define CTL_TICK_MS 100

/* "server" or "worker" (role: a ctl_role), for logs and errors. */
static inline const char *ctl_role_name(int role)
{
    return role == CTL_ROLE_SERVER ? "server" : "worker";
}

#endif
