/* The control plane's address book: who is in the run (every member's role, rank and fabric address), the
 * run config and the shard map, as every member receives them when the run forms. The lowest layer of the
 * control plane: the frame coding (ctl_frame.h) and the service and session API (ctl.h) both build on it. */
#ifndef PFCPS_COMMON_CTL_BOOK_H
#define PFCPS_COMMON_CTL_BOOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/ckpt_ident.h"

/* Bytes of a member's opaque address: a server's endpoint name, or a worker's packed parts
 * (common/member_addr.h: two endpoint names, plus worker 0's 128-byte NCCL unique id on CUDA runs). */
#define CTL_MAX_ADDR 512

/* Checkpoint steps a member may list at join (Join.resume_steps). */
#define CTL_MAX_RESUME_STEPS 1024

typedef enum { CTL_ROLE_SERVER = 0, CTL_ROLE_WORKER = 1 } ctl_role;

/* Kinds of the Failover message (proto/ctl.proto; docs/architecture.md, "Hot-standby shards"): a server lost
 * and failed over; a restarted server rejoining as a learner (begins, the copy's checkpoint step, the learner
 * ready, rejoined, aborted). */
enum {
    CTL_FO_LOST = 0,
    CTL_FO_REJOIN_BEGIN = 1,
    CTL_FO_REJOIN_STEP = 2,
    CTL_FO_REJOIN_READY = 3,
    CTL_FO_REJOINED = 4,
    CTL_FO_REJOIN_ABORTED = 5,
    /* worker replacement in place (docs/architecture.md, "Worker replacement in place") */
    CTL_FO_WORKER_LOST = 6,
    CTL_FO_WORKER_REPORT = 7,
    CTL_FO_ROLLBACK = 8,
    CTL_FO_ROLLED_BACK = 9,
    CTL_FO_REDO = 10,
    CTL_FO_STATE_READY = 11,
    CTL_FO_NO_REDO = 12,
    /* the end of training (docs/architecture.md, "The end of training"): a worker passed the end vote (every
     * worker's final outputs are written); the rendezvous calls off a replacement that is no longer needed */
    CTL_FO_END_VOTED = 13,
    CTL_FO_RUN_ENDED = 14,
    CTL_FO_KIND_MAX = 14
};

typedef struct ctl_member {
    ctl_role role;
    int rank;
    size_t addr_len;
    uint8_t addr[CTL_MAX_ADDR]; /* fabric endpoint name, opaque */
} ctl_member;

typedef struct ctl_book {
    int num_servers, num_workers;
    ctl_member *servers; /* [num_servers], index = rank */
    ctl_member *workers; /* [num_workers], index = rank */
    char *config_text;   /* effective run config, INI text (cfg_load_text) */
    int64_t num_classes; /* C of the shard map (class c on server c mod S at local row c div S) */
    int64_t resume_step; /* > 0: every member loads checkpoint resume_step (common/ckpt.h); 0: from scratch */
    char resume_reason[1024];          /* why that step (or none), for the members' logs */
    uint8_t run_nonce[16];             /* this run's nonce (ctl_data_token) */
    uint8_t run_id[CKPT_RUN_ID_BYTES]; /* the run id every checkpoint file carries (common/ckpt.h): the
                                          resumed step's, or a new random one when the run starts afresh */
    uint32_t rejoin_epoch; /* > 0: this server rejoins the formed run as a learner at this membership epoch:
                              it loads its two shards from checkpoint resume_step (docs/architecture.md,
                              "Hot-standby shards"); for a worker, it replaces a lost worker and
                              loads worker `donor`'s state of step resume_step (docs/architecture.md, "Worker
                              replacement in place"); 0: a member of the run as it forms */
    int donor;
    int nlost; /* a replacing worker or a rejoining server: the servers failed over and not rejoined (but
                  itself), lost[0..nlost) */
    int *lost;
} ctl_book;

#endif
