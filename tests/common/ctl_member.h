/* A member of the control-plane tests (test_ctl_*.c): a control session joined to the rendezvous at
 * 127.0.0.1:`port` from a thread (join_main) or inline. The including file defines SECRET (the join secret)
 * and MAXF (the frame bound) first, and sets `port` once its rendezvous listens. */
#ifndef PFCPS_TESTS_COMMON_CTL_MEMBER_H
#define PFCPS_TESTS_COMMON_CTL_MEMBER_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/ctl.h"
#include "common/err.h"

static int port;

typedef struct member {
    ctl_role role;
    int rank;
    const char *addr; /* its address-book entry (a string) */
    double timeout;   /* the join's timeout in seconds */
    pthread_t th;
    int rc; /* ctl_join's */
    ctl_session *s;
    char msg[512]; /* pf_errmsg() of the joining thread when rc < 0 */
} member;

/* Joins m (a member *) as its role and rank: m->rc and m->s (m->msg: the error, when it failed). */
static void *join_main(void *arg)
{
    member *m = arg;
    m->rc = ctl_join("127.0.0.1", port, m->role, m->rank, m->addr, strlen(m->addr), SECRET, MAXF, m->timeout,
                     &m->s);
    if (m->rc < 0)
        snprintf(m->msg, sizeof m->msg, "%s", pf_errmsg());
    return NULL;
}

#endif
