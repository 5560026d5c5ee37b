/* Test helper: one member process of a run. Joins the rendezvous, writes its address book (the
 * canonical dump of ctl_book_dump.h) to OUTFILE, waits for the shutdown broadcast, exits 0.
 *
 * usage: ctl_member HOST PORT server|worker RANK ADDR SECRET OUTFILE [TIMEOUT_S]
 * A refused join writes "error <rc> <message>" to OUTFILE and exits with -rc (EEXIST 17, EACCES 13,
 * ERANGE 34, ...); exit 3 when no shutdown came in time, 2 for a usage error. OUTFILE is written to
 * a temporary name and renamed, so a reader never sees half of it. */
#include "common/ctl.h"
#include "common/err.h"
#include "common/log.h"
#include "ctl_book_dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_out(const char *path, const char *text)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fputs(text, f);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: %s HOST PORT server|worker RANK ADDR SECRET OUTFILE [TIMEOUT_S]\n", argv[0]);
        return 2;
    }
    ctl_role role = strcmp(argv[3], "server") == 0 ? CTL_ROLE_SERVER : CTL_ROLE_WORKER;
    int rank = atoi(argv[4]);
    double timeout = argc > 8 ? atof(argv[8]) : 10.0;
    log_init(argv[3], rank);
    ctl_session *s;
    int rc =
        ctl_join(argv[1], atoi(argv[2]), role, rank, argv[5], strlen(argv[5]), argv[6], 1 << 16, timeout, &s);
    if (rc < 0) {
        char msg[PF_ERRMSG_MAX + 32];
        snprintf(msg, sizeof msg, "error %d %s\n", rc, pf_errmsg());
        log_error("join failed: %s", pf_errmsg());
        write_out(argv[7], msg);
        return -rc;
    }
    char *dump = book_dump(ctl_session_book(s));
    if (!dump || write_out(argv[7], dump) != 0) {
        free(dump);
        ctl_session_close(s);
        return 1;
    }
    free(dump);
    rc = ctl_session_wait_shutdown(s, timeout);
    ctl_session_close(s);
    if (rc != 1) {
        log_error("no shutdown broadcast (wait returned %d: %s)", rc, pf_errmsg());
        return 3;
    }
    return 0;
}
