/* The rendezvous's run-forming policy (common/ctl_forming.c) without sockets: seat numbering, which joins
 * take a rank and which are refused (outside the run, rank still held, a restarted member of a formed run,
 * told once), when the run is complete, what a departure means before and after the run formed, the
 * resume step with its reason, and the never-joined report. Every expected value is worked out by hand
 * from the contract in common/ctl_forming.h. */
#include "common/ctl_forming.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

/* Distinct holders: the roster compares the pointers only. */
static int holder[8];

/* Admits (role, rank) and gives it the seat with `steps` (n of them); fails the test when refused. */
static void join(ctl_roster *r, ctl_role role, int rank, const int64_t *steps, size_t n)
{
    ctl_admission adm;
    assert_int_equal(ctl_roster_admit(r, role, rank, &adm), 0);
    assert_int_equal(adm.code, 0);
    assert_string_equal(adm.reason, "");
    int seat = adm.seat;
    ctl_roster_take(r, seat, &holder[seat], "127.0.0.1:4000", steps, NULL, n);
}

/* The resume step of a roster of S servers + W workers whose members list steps[i][0..n[i]) (seat order:
 * servers first), with resume on; the reason goes to reason[cap]. */
static int64_t resume_of(int S, int W, const int64_t *const *steps, const size_t *n, char *reason, size_t cap)
{
    ctl_roster r;
    assert_int_equal(ctl_roster_init(&r, S, W, 1), 0);
    for (int i = 0; i < S + W; i++)
        join(&r, i < S ? CTL_ROLE_SERVER : CTL_ROLE_WORKER, i < S ? i : i - S, steps[i], n[i]);
    assert_true(ctl_roster_complete(&r));
    uint8_t run_id[CKPT_RUN_ID_BYTES];
    int64_t t = ctl_roster_resume_step(&r, reason, cap, run_id);
    ctl_roster_free(&r);
    return t;
}

static void test_seats(void **state)
{
    (void)state;
    ctl_roster r;
    assert_int_equal(ctl_roster_init(&r, 2, 3, 0), 0);
    assert_int_equal(ctl_roster_size(&r), 5);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_SERVER, 0), 0);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_SERVER, 1), 1);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_WORKER, 0), 2);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_WORKER, 2), 4);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_SERVER, 2), -1);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_WORKER, 3), -1);
    assert_int_equal(ctl_roster_seat(&r, CTL_ROLE_WORKER, -1), -1);
    assert_int_equal(ctl_roster_role(&r, 1), CTL_ROLE_SERVER);
    assert_int_equal(ctl_roster_role(&r, 2), CTL_ROLE_WORKER);
    assert_int_equal(ctl_roster_rank(&r, 1), 1);
    assert_int_equal(ctl_roster_rank(&r, 4), 2);
    ctl_roster_free(&r);
}

/* Before the run forms: a rank outside the run is refused (ERANGE); a held rank is refused with EAGAIN
 * naming its holder; a rank freed by its holder can be taken again; the run is complete at S + W. */
static void test_admit_before_forming(void **state)
{
    (void)state;
    ctl_roster r;
    ctl_admission adm;
    assert_int_equal(ctl_roster_init(&r, 2, 3, 0), 0);
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_SERVER, 2, &adm), ERANGE);
    assert_string_equal(adm.reason, "join refused: server rank 2 is outside [0, 2)");
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 3, &adm), ERANGE);
    assert_string_equal(adm.reason, "join refused: worker rank 3 is outside [0, 3)");

    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), 0);
    assert_int_equal(adm.seat, 3);
    assert_int_equal(ctl_roster_take(&r, 3, &holder[0], "10.0.0.1:5000", NULL, NULL, 0), 1);
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), EAGAIN);
    assert_int_equal(adm.restarted, 0);
    assert_string_equal(
        adm.reason, "worker rank 1 is still held by 10.0.0.1:5000 (a previous process not yet gone?); retry");

    /* Only the holder frees a seat; before the run formed the rank is free again. */
    assert_int_equal(ctl_roster_release(&r, 3, &holder[1], 0, 0), CTL_GONE_NOTHING);
    assert_int_equal(r.held, 1);
    assert_int_equal(ctl_roster_release(&r, 3, &holder[0], 0, 0), CTL_GONE_FREED);
    assert_int_equal(r.held, 0);
    assert_int_equal(ctl_roster_release(&r, 3, &holder[0], 0, 0), CTL_GONE_NOTHING);
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), 0);

    join(&r, CTL_ROLE_SERVER, 0, NULL, 0);
    join(&r, CTL_ROLE_SERVER, 1, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 0, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 2, NULL, 0);
    assert_false(ctl_roster_complete(&r)); /* 4 of 5 */
    join(&r, CTL_ROLE_WORKER, 1, NULL, 0);
    assert_true(ctl_roster_complete(&r));
    r.formed = 1;
    assert_false(ctl_roster_complete(&r)); /* forms once */
    ctl_roster_free(&r);
}

/* After the run formed: a join for a seat whose member is still connected is refused with EAGAIN and the run
 * goes on (no re-form); once the seat is free (its member lost), a join is a restarted member, refused with
 * EAGAIN, and only the first asks for the members to be told, after which every join (held seat or not) is
 * told the run is re-forming; a departure is quiet when said or after the shutdown, else a loss. */
static void test_after_forming(void **state)
{
    (void)state;
    ctl_roster r;
    ctl_admission adm;
    assert_int_equal(ctl_roster_init(&r, 1, 2, 0), 0);
    join(&r, CTL_ROLE_SERVER, 0, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 0, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 1, NULL, 0);
    r.formed = 1;

    /* Every seat held by a connected member: a second process for worker 1 changes nothing. */
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), EAGAIN);
    assert_int_equal(adm.restarted, 0);
    assert_int_equal(r.reforming, 0);
    assert_string_equal(adm.reason,
                        "worker rank 1 is held by a live member of the formed run (127.0.0.1:4000): "
                        "is a second process of this rank running (started twice, or by two "
                        "supervisors), or another run using this rendezvous and secret? retry");
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_SERVER, 1, &adm), ERANGE); /* range comes first */

    /* Seats: server 0 = 0, worker 0 = 1, worker 1 = 2 (holder[seat], set by join). Worker 1 crashes; its
     * restarted process joins: the run re-forms, told once. */
    assert_int_equal(ctl_roster_release(&r, 2, &holder[2], 0, 0), CTL_GONE_LOST); /* crashed */
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), EAGAIN);
    assert_int_equal(adm.restarted, 1);
    assert_int_equal(r.reforming, 1);
    assert_string_equal(adm.reason, "worker rank 1: the run is re-forming after a member restarted; retry");
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_WORKER, 1, &adm), EAGAIN);
    assert_int_equal(adm.restarted, 0);
    assert_int_equal(ctl_roster_admit(&r, CTL_ROLE_SERVER, 0, &adm), EAGAIN); /* held, but re-forming */
    assert_int_equal(adm.restarted, 0);
    assert_string_equal(adm.reason, "server rank 0: the run is re-forming after a member restarted; retry");

    assert_int_equal(ctl_roster_release(&r, 1, &holder[1], 1, 0), CTL_GONE_QUIET); /* said it leaves */
    assert_int_equal(ctl_roster_release(&r, 0, &holder[0], 0, 1), CTL_GONE_QUIET); /* after the shutdown */
    assert_int_equal(r.held, 0);
    ctl_roster_free(&r);
}

/* A server's orderly leave ends the run for the others only while workers still need its shard. */
static void test_server_leave(void **state)
{
    (void)state;
    ctl_roster r;
    assert_int_equal(ctl_roster_init(&r, 2, 3, 0), 0);
    assert_false(ctl_roster_server_leave_is_loss(&r, 0, 0)); /* not formed: its rank is just free */
    r.formed = 1;
    assert_true(ctl_roster_server_leave_is_loss(&r, 0, 0));
    assert_true(ctl_roster_server_leave_is_loss(&r, 2, 0));  /* 2 of 3 workers left */
    assert_false(ctl_roster_server_leave_is_loss(&r, 3, 0)); /* training is over */
    assert_false(ctl_roster_server_leave_is_loss(&r, 0, 1)); /* the shutdown went out */
    ctl_roster_free(&r);
}

static void test_resume_newest_common(void **state)
{
    (void)state;
    char reason[512];
    /* {10,20,30}, {20,30}, {30}: 30 is on everyone. */
    const int64_t a[] = {10, 20, 30}, b[] = {20, 30}, c[] = {30};
    const int64_t *s1[] = {a, b, c};
    const size_t n1[] = {3, 2, 1};
    assert_int_equal(resume_of(1, 2, s1, n1, reason, sizeof reason), 30);
    assert_string_equal(reason, "step 30 is the newest checkpoint complete on all 3 members");

    /* {10,20}, {20,30}: 30 lacks on server 0, 20 is on both. */
    const int64_t d[] = {10, 20}, e[] = {20, 30};
    const int64_t *s2[] = {d, e};
    const size_t n2[] = {2, 2};
    assert_int_equal(resume_of(1, 1, s2, n2, reason, sizeof reason), 20);
    assert_string_equal(reason, "step 30 skipped: not complete on server[0]; "
                                "step 20 is the newest checkpoint complete on all 2 members");

    /* Lists in any order: {30,10,20}, {20,10} -> 20 (30 lacks on worker 0). */
    const int64_t f[] = {30, 10, 20}, g[] = {20, 10};
    const int64_t *s3[] = {f, g};
    const size_t n3[] = {3, 2};
    assert_int_equal(resume_of(1, 1, s3, n3, reason, sizeof reason), 20);
    assert_string_equal(reason, "step 30 skipped: not complete on worker[0]; "
                                "step 20 is the newest checkpoint complete on all 2 members");
}

static void test_resume_from_scratch(void **state)
{
    (void)state;
    char reason[512];
    /* A member with no steps: every candidate is skipped, naming it; the run starts from scratch (0). */
    const int64_t a[] = {10, 20};
    const int64_t *s1[] = {a, NULL};
    const size_t n1[] = {2, 0};
    assert_int_equal(resume_of(1, 1, s1, n1, reason, sizeof reason), 0);
    assert_string_equal(reason, "step 20 skipped: not complete on worker[0]; "
                                "step 10 skipped: not complete on worker[0]; "
                                "no checkpoint is complete on all 2 members: starting from scratch");

    /* The first seat lacking a step is the one named: servers 0 {5}, 1 {}, worker 0 {}. */
    const int64_t b[] = {5};
    const int64_t *s2[] = {b, NULL, NULL};
    const size_t n2[] = {1, 0, 0};
    assert_int_equal(resume_of(2, 1, s2, n2, reason, sizeof reason), 0);
    assert_string_equal(reason, "step 5 skipped: not complete on server[1]; "
                                "no checkpoint is complete on all 3 members: starting from scratch");

    /* Nobody lists a step. */
    const int64_t *s3[] = {NULL, NULL};
    const size_t n3[] = {0, 0};
    assert_int_equal(resume_of(1, 1, s3, n3, reason, sizeof reason), 0);
    assert_string_equal(reason, "no checkpoint is complete on all 2 members: starting from scratch");

    /* Without resume the lists do not matter. */
    ctl_roster r;
    assert_int_equal(ctl_roster_init(&r, 1, 1, 0), 0);
    const int64_t c[] = {10};
    join(&r, CTL_ROLE_SERVER, 0, c, 1);
    join(&r, CTL_ROLE_WORKER, 0, c, 1);
    uint8_t run_id[CKPT_RUN_ID_BYTES];
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), 0);
    assert_string_equal(reason, "resume = false: starting from scratch");
    ctl_roster_free(&r);
}

/* A 1 server + 1 worker roster resuming with the run identity *cur, both seats listing steps[0..1] with the
 * identities ids[0..1]. */
static void expect_pair(ctl_roster *r, const ckpt_ident *cur, const int64_t *steps, const ckpt_ident *ids)
{
    assert_int_equal(ctl_roster_init(r, 1, 1, 1), 0);
    r->has_expect = 1;
    r->expect = *cur;
    for (int i = 0; i < 2; i++) {
        ctl_admission adm;
        assert_int_equal(ctl_roster_admit(r, i < 1 ? CTL_ROLE_SERVER : CTL_ROLE_WORKER, 0, &adm), 0);
        ctl_roster_take(r, adm.seat, &holder[adm.seat], "127.0.0.1:4000", steps, ids, 2);
    }
}

/* Identities: a step whose files are of another run on some seat, or of another config than the run's, is
 * skipped with the seat and the fields named; the chosen step's run id comes back. */
static void test_resume_identity(void **state)
{
    (void)state;
    ckpt_ident a = {.seed = 2048}, b = {.seed = 7}, cur = {.seed = 2048};
    memset(a.run_id, 0xaa, sizeof a.run_id);
    memset(b.run_id, 0xbb, sizeof b.run_id);
    memset(a.config_digest, 1, sizeof a.config_digest);
    memset(b.config_digest, 2, sizeof b.config_digest);
    cur = a;
    const int64_t steps[] = {12, 8};
    const ckpt_ident same[] = {a, a}, foreign12[] = {b, a}, foreign_both[] = {b, b};
    char reason[1024];
    uint8_t run_id[CKPT_RUN_ID_BYTES] = {0};

    /* server[1] holds step 12 from another run: 12 skipped, 8 chosen with its run id. */
    ctl_roster r;
    assert_int_equal(ctl_roster_init(&r, 2, 1, 1), 0);
    const ckpt_ident *ids[] = {same, foreign12, same};
    for (int i = 0; i < 3; i++) {
        ctl_admission adm;
        assert_int_equal(ctl_roster_admit(&r, i < 2 ? CTL_ROLE_SERVER : CTL_ROLE_WORKER, i < 2 ? i : 0, &adm),
                         0);
        ctl_roster_take(&r, adm.seat, &holder[adm.seat], "127.0.0.1:4000", steps, ids[i], 2);
    }
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), 8);
    assert_memory_equal(run_id, a.run_id, sizeof run_id);
    assert_non_null(strstr(reason,
                           "step 12 skipped: server[1]'s files are of another run than server[0]'s: "
                           "run_id bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb vs aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, "
                           "seed 7 vs 2048, config_digest 0202020202020202... vs 0101010101010101...; "
                           "step 8 is the newest checkpoint complete on all 3 members"));
    ctl_roster_free(&r);

    /* Every seat agrees, but on another config than the run's: nothing is resumed, and the run must not form
     * (a new run would write over those checkpoints); the run id is untouched. */
    expect_pair(&r, &cur, steps, foreign_both);
    memset(run_id, 0x11, sizeof run_id);
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), -1);
    assert_int_equal(run_id[0], 0x11);
    assert_non_null(strstr(reason,
                           "step 12 skipped: written by a run with another config: seed 7 vs 2048, "
                           "config_digest 0202020202020202... vs 0101010101010101... (the files vs this "
                           "run's config); step 8 skipped"));
    assert_non_null(strstr(reason,
                           "resume = true, but step 12, complete on all 2 members, is of a run with another "
                           "config, newer than any step this run can resume (none: 0): training from "
                           "there would overwrite its checkpoints"));
    ctl_roster_free(&r);

    /* Every seat holds step 12 of another config and step 8 of this one: resuming at 8 would write step 12
     * over the other run's, so the run does not form either. */
    const ckpt_ident mixed[] = {b, a};
    expect_pair(&r, &cur, steps, mixed);
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), -1);
    assert_non_null(strstr(reason,
                           "resume = true, but step 12, complete on all 2 members, is of a run with another "
                           "config, newer than any step this run can resume (step 8)"));
    ctl_roster_free(&r);
}

/* resume_run: with the run pinned, a newer step of another run with the same config (its checkpoints left in
 * the same folder) does not count: the pinned run's own newest step is chosen, the other named; with none of
 * the pinned run's steps, nothing is resumed. */
static void test_resume_pinned_run(void **state)
{
    (void)state;
    ckpt_ident mine = {.seed = 2048}, other = {.seed = 2048};
    memset(mine.run_id, 0xaa, sizeof mine.run_id);
    memset(other.run_id, 0xbb, sizeof other.run_id);
    memset(mine.config_digest, 1, sizeof mine.config_digest);
    memset(other.config_digest, 1, sizeof other.config_digest);
    const int64_t steps[] = {36, 8};
    const ckpt_ident ids[] = {other, mine}, only_other[] = {other, other};
    char reason[1024];
    uint8_t run_id[CKPT_RUN_ID_BYTES] = {0};
    ctl_roster r;

    /* Not pinned: the newest step every member holds, the other run's 36. */
    expect_pair(&r, &mine, steps, ids);
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), 36);
    assert_memory_equal(run_id, other.run_id, sizeof run_id);
    ctl_roster_free(&r);

    expect_pair(&r, &mine, steps, ids);
    r.has_run = 1;
    memcpy(r.run, mine.run_id, sizeof r.run);
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), 8);
    assert_memory_equal(run_id, mine.run_id, sizeof run_id);
    assert_non_null(strstr(reason,
                           "step 36 skipped: of run bbbbbbbb..., not resume_run aaaaaaaa...; step 8 is the "
                           "newest checkpoint complete on all 2 members"));
    ctl_roster_free(&r);

    expect_pair(&r, &mine, steps, only_other);
    r.has_run = 1;
    memcpy(r.run, mine.run_id, sizeof r.run);
    memset(run_id, 0x11, sizeof run_id);
    assert_int_equal(ctl_roster_resume_step(&r, reason, sizeof reason, run_id), 0);
    assert_int_equal(run_id[0], 0x11);
    assert_non_null(strstr(reason, "no checkpoint is complete on all 2 members: starting from scratch"));
    ctl_roster_free(&r);
}

/* A reason longer than its buffer is cut to fit (the step is still right). */
static void test_resume_reason_truncated(void **state)
{
    (void)state;
    char reason[24];
    memset(reason, 'x', sizeof reason);
    const int64_t a[] = {10, 20}, b[] = {20, 30};
    const int64_t *s[] = {a, b};
    const size_t n[] = {2, 2};
    assert_int_equal(resume_of(1, 1, s, n, reason, sizeof reason), 20);
    assert_int_equal(strlen(reason), sizeof reason - 1);
    assert_string_equal(reason, "step 30 skipped: not co");
}

static void test_never_joined(void **state)
{
    (void)state;
    ctl_roster r;
    char out[64];
    assert_int_equal(ctl_roster_init(&r, 2, 2, 0), 0);
    assert_int_equal(ctl_roster_never_joined(&r, out, sizeof out), 4);
    assert_string_equal(out, "server[0], server[1], worker[0], worker[1]");
    /* Server 1 joins and leaves again: it did join once. */
    join(&r, CTL_ROLE_SERVER, 1, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 0, NULL, 0);
    assert_int_equal(ctl_roster_release(&r, 1, &holder[1], 0, 0), CTL_GONE_FREED);
    assert_int_equal(ctl_roster_never_joined(&r, out, sizeof out), 2);
    assert_string_equal(out, "server[0], worker[1]");
    /* Counted in full even when the list is cut. */
    char small[8];
    assert_int_equal(ctl_roster_never_joined(&r, small, sizeof small), 2);
    assert_string_equal(small, "server[");
    join(&r, CTL_ROLE_SERVER, 0, NULL, 0);
    join(&r, CTL_ROLE_WORKER, 1, NULL, 0);
    assert_int_equal(ctl_roster_never_joined(&r, out, sizeof out), 0);
    assert_string_equal(out, "");
    ctl_roster_free(&r);
}

/* Hot-standby shards: shard s on servers s and (s + 1) mod S. Worked out by hand: S = 3, copies of shard 0 on
 * servers 0 and 1, shard 1 on 1 and 2, shard 2 on 2 and 0. */
static void test_failover_possible(void **state)
{
    (void)state;
    uint8_t lost[4] = {0};
    char why[256];
    /* Server 1 of 3: shards 0 (backup gone) and 1 (primary gone) keep one copy each. */
    assert_int_equal(ctl_failover_possible(lost, 3, 1, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 1");
    /* Server 0 holds the rendezvous. */
    assert_int_equal(ctl_failover_possible(lost, 3, 0, why, sizeof why), 0);
    assert_string_equal(why, "server 0 holds the rendezvous");
    /* After server 1, server 2: shard 1's copies are servers 1 and 2, both gone. */
    lost[1] = 1;
    assert_int_equal(ctl_failover_possible(lost, 3, 2, why, sizeof why), 0);
    assert_string_equal(why, "both copies of shard 1 are lost (servers 1 and 2)");
    /* S = 4, server 1 lost already: server 3 shares no shard with it (shards 2, 3 lose a copy; 0, 1 had). */
    assert_int_equal(ctl_failover_possible(lost, 4, 3, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 1, 2, 3");
    /* S = 2: server 1 holds shard 1 and shard 0's backup; both keep server 0's copy. */
    lost[1] = 0;
    assert_int_equal(ctl_failover_possible(lost, 2, 1, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 1");
    /* One server: no other copy. */
    assert_int_equal(ctl_failover_possible(lost, 1, 0, why, sizeof why), 0);
}

/* A member's own rule for the loss of server 0 with the rendezvous (ctl_session.c): the copies decide alone. */
static void test_shards_survive(void **state)
{
    (void)state;
    uint8_t lost[4] = {0};
    char why[256];
    /* Server 0 of 2: shard 0 keeps its backup on server 1, shard 1 its primary. */
    assert_int_equal(ctl_shards_survive(lost, 2, 0, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 1");
    /* Server 0 of 3: shards 0 and 2 lose a copy each. */
    assert_int_equal(ctl_shards_survive(lost, 3, 0, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 2");
    /* Server 1 failed over before: shard 0's copies are servers 0 and 1, both gone. */
    lost[1] = 1;
    assert_int_equal(ctl_shards_survive(lost, 3, 0, why, sizeof why), 0);
    assert_string_equal(why, "both copies of shard 0 are lost (servers 0 and 1)");
    /* S = 3, server 2 failed over before: shard 2's copies are servers 2 and 0. */
    lost[1] = 0;
    lost[2] = 1;
    assert_int_equal(ctl_shards_survive(lost, 3, 0, why, sizeof why), 0);
    assert_string_equal(why, "both copies of shard 2 are lost (servers 2 and 0)");
    /* S = 4, server 2 failed over before: every shard keeps a copy without server 0. */
    assert_int_equal(ctl_shards_survive(lost, 4, 0, why, sizeof why), 1);
    assert_string_equal(why, "shards 0, 1, 2, 3");
    /* Without replicas' copies (one server) nothing survives. */
    assert_int_equal(ctl_shards_survive(lost, 1, 0, why, sizeof why), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seats),
        cmocka_unit_test(test_shards_survive),
        cmocka_unit_test(test_admit_before_forming),
        cmocka_unit_test(test_after_forming),
        cmocka_unit_test(test_server_leave),
        cmocka_unit_test(test_resume_newest_common),
        cmocka_unit_test(test_resume_from_scratch),
        cmocka_unit_test(test_resume_identity),
        cmocka_unit_test(test_resume_pinned_run),
        cmocka_unit_test(test_resume_reason_truncated),
        cmocka_unit_test(test_never_joined),
        cmocka_unit_test(test_failover_possible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
