/* pfcps plan's arithmetic (tools/plan.h) against values computed by hand from the model stated there and the
 * sizes it names (server/shard.c: 2 page-rounded regions of rows x D x 4 bytes + 1 byte per row, margin 1/16
 * + 256 MiB; ps_wire.h: 64-byte headers, at most floor(1 MiB / (D x wire + 8)) rows per message, message
 * buffers of 64 + rows x (4 D + 8) bytes; server/ps_server.c: 64 receive + 64 send buffers). Each expected
 * number below is worked out in the comment above it; none is read back from the code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>

#include "tools/plan.h"

#define assert_near(a, b) assert_true(fabs((double)(a) - (double)(b)) <= 1e-9 * fabs((double)(b)) + 1e-15)

/* C = 1000, D = 4, r = 0.1, W = 2, B = 3, fp32, global mode, 8 Gbit/s (1e9 B/s), 1 GB/s, 1 GFLOP/s, 1 GiB. */
static plan_in case_a(void)
{
    return (plan_in){.identities = 1000,
                     .dim = 4,
                     .sample_rate = 0.1,
                     .workers = 2,
                     .batch = 3,
                     .wire_bytes = 4,
                     .link_gbps = 8,
                     .mem_gbs = 1,
                     .gemm_gflops = 1,
                     .server_mem_gib = 1};
}

/* optimizer = adamw: a third region (the second moment) and 2 more memory passes per pushed row. */
static void test_adamw(void **state)
{
    (void)state;
    plan_in in = case_a();
    in.adamw = 1;
    plan_out p;
    assert_int_equal(plan_compute(&in, &p), 0);
    /* 12 x 4 + 9 = 57 bytes per identity; 57000 for the table. */
    assert_int_equal(p.bytes_per_identity, 57);
    assert_near(p.table_bytes, 57000);
    /* S = 1: regions 3 x 16384 = 49152, rows 1000 x 9 = 9000, margin 49152/16 = 3072 + 268435456, buffers
     * 134229920 (as case_a's): 402726600. */
    assert_near(plan_server_need(&in, 1, 100), 402726600.0);
    /* memory: W k / S = 100 rows x (7 + 2) passes x 16 bytes = 14400 bytes at 1 GB/s = 14.4 us at S = 1. */
    plan_in one = in;
    one.servers = 1;
    assert_int_equal(plan_compute(&one, &p), 0);
    assert_near(p.mem_s, 14.4e-6);
}

static void test_global_rate(void **state)
{
    (void)state;
    plan_in in = case_a();
    plan_out p;
    assert_int_equal(plan_compute(&in, &p), 0);
    /* P = ceil(1000 / 2) = 500, N = W B = 6, k = ceil(0.1 x 500) = 50 (>= min(6, 500)). */
    assert_int_equal(p.partition, 500);
    assert_int_equal(p.n, 6);
    assert_int_equal(p.k, 50);
    /* 8 x 4 + 9 = 41 bytes per identity (weight, momentum, row state, apply bookkeeping); 41000 for the table. */
    assert_int_equal(p.bytes_per_identity, 41);
    assert_near(p.table_bytes, 41000);
    /* head: 6 x 6 x 50 x 4 = 7200 FLOP at 1e9/s = 7.2 us. */
    assert_near(p.head_flop, 7200);
    assert_near(p.head_s, 7.2e-6);
    /* Memory at S = 1: regions 2 x page(1000 x 16 = 16000 -> 16384) = 32768, rows 1000 x 9, margin 32768/16 =
     * 2048
     * + 268435456; buffers: message = the longest of any wire dtype, fp16: 64 + 65536 x (8 + 8) = 1048640
     * (65536 = floor(1048576 / 16); fp32: 64 + 43690 x 24 = 1048624), 128 of them = 134225920, + W
     * ceil(50/1) = 100 rows x (8 + 16) + 100 x 16 = 4000 -> 134229920. Total 402709192 < 1 GiB: one server
     * holds it. */
    assert_near(plan_server_need(&in, 1, 100), 402709192.0);
    assert_int_equal(p.servers_mem, 1);
    /* Bandwidth: a worker's link at S = 1 (one message each way): pull 8 x 50 + 64 = 464 out, 16 x 50 + 64 =
     * 864 in; push 24 x 50 + 64 = 1264 out, 64 in: (864 + 1264) / 1e9 = 2.128 us. With unlimited servers the
     * step is 2.128 + 7.2 = 9.328 us; within 10% (10.2608 us) the transfers may take 3.0608 us: the servers'
     * links 2/S x 2.128 us need S >= 2, their memory (100 / S) rows x 7 x 16 B / 1e9 = 11.2 us / S needs
     * S >= 4. */
    assert_near(p.step_limit_s, 9.328e-6);
    assert_int_equal(p.servers_bw, 4);
    assert_int_equal(p.servers, 4);
    /* At S = 4: 50 rows = 2 servers x 13 + 2 x 12, one message each: 4 messages per pull and per push.
     * pull out 400 + 256 = 656, in 800 + 256 = 1056; push out 1200 + 256 = 1456, in 256; sum 3424. */
    assert_near(p.pull_out_bytes, 656);
    assert_near(p.pull_in_bytes, 1056);
    assert_near(p.push_out_bytes, 1456);
    assert_near(p.push_in_bytes, 256);
    assert_near(p.worker_link_bytes, 3424);
    /* A server carries 2/4 of a worker's bytes: 1712; its rows 100 / 4 = 25. */
    assert_near(p.server_link_bytes, 1712);
    assert_near(p.server_rows, 25);
    /* link = (1056 + 1456) / 1e9 = 2.512 us; memory = 25 x 7 x 16 / 1e9 = 2.8 us; step = 2.8 + 7.2 = 10 us.
     */
    assert_near(p.link_s, 2.512e-6);
    assert_near(p.mem_s, 2.8e-6);
    assert_near(p.transfer_s, 2.8e-6);
    assert_near(p.step_s, 10e-6);
    assert_string_equal(p.bound, "head compute");
    /* Shard at S = 4: 250 rows x 16 = 4000 -> 4096 per region: 8192 + 250 x 9 = 10442. Buffers: 134225920 +
     * W ceil(50 / 4) = 26 rows x (24 + 16) = 134226960. Need: 8192 + 2250 + 512 + 268435456 + 134226960 =
     * 402673370. */
    assert_near(p.shard_bytes, 10442);
    assert_near(p.buffer_bytes, 134226960);
    assert_near(p.server_need_bytes, 402673370);
    /* The same run at 6 servers (--servers 6): 50 rows = 2 x 9 + 4 x 8, 6 messages per pull and push: pull
     * out 400 + 384 = 784, in 800 + 384 = 1184, push out 1200 + 384 = 1584, in 384; a server carries 2/6 of
     * the 3936 bytes (1312); link (1184 + 1584) / 1e9 = 2.768 us, memory 100/6 x 112 / 1e9 = 1.8667 us; shard
     * 167 rows: 8192 + 167 x 9. */
    in.servers = 6;
    assert_int_equal(plan_compute(&in, &p), 0);
    assert_int_equal(p.servers, 6);
    assert_near(p.pull_out_bytes, 784);
    assert_near(p.pull_in_bytes, 1184);
    assert_near(p.push_out_bytes, 1584);
    assert_near(p.push_in_bytes, 384);
    assert_near(p.server_link_bytes, 1312);
    assert_near(p.link_s, 2.768e-6);
    assert_near(p.mem_s, 100.0 / 6 * 112 / 1e9);
    assert_near(p.step_s, 9.968e-6);
    assert_near(p.shard_bytes, 9695);
    in.servers = 0;
    assert_int_equal(plan_compute(&in, &p), 0);
    /* Worker: rows + gradients 2 x 50 x 16 = 1600; workspace (6 x 50 + 56 x 4 + 12) x 4 = 2144 and (24 + 50)
     * x 8 = 592; the push copy 50 x 16 = 800; sort keys 32 x 50 = 1600; global embeddings 2 x 6 x 4 x 4 =
     * 192. */
    assert_near(p.worker_head_bytes, 6928);
}

/* Local mode, --sampled beyond the partition, bf16, 4 servers given, a 1 ms backbone. */
static void test_local_sampled(void **state)
{
    (void)state;
    plan_in in = case_a();
    in.local_mode = 1;
    in.sample_rate = 0;
    in.sampled = 2000;
    in.wire_bytes = 2;
    in.servers = 4;
    in.backbone_s = 1e-3;
    plan_out p;
    assert_int_equal(plan_compute(&in, &p), 0);
    /* Local: P = C = 1000, N = B = 3, k = min(2000, 1000) = 1000. */
    assert_int_equal(p.partition, 1000);
    assert_int_equal(p.n, 3);
    assert_int_equal(p.k, 1000);
    /* 250 rows per server, one message each (65536 = 1 MiB / 16 per message): 4 messages per pull and push.
     * pull out 8000 + 256, in 1000 x 8 + 256 = 8256; push out 1000 x 16 + 256 = 16256, in 256. */
    assert_near(p.pull_out_bytes, 8256);
    assert_near(p.pull_in_bytes, 8256);
    assert_near(p.push_out_bytes, 16256);
    assert_near(p.push_in_bytes, 256);
    /* link (8256 + 16256) / 1e9 = 24.512 us (a server: 2/4 of it); memory 500 rows x 112 / 1e9 = 56 us; head
     * 6 x 3 x 1000 x 4 = 72000 FLOP = 72 us; step = max(1 ms, 56 us) + 72 us. */
    assert_near(p.link_s, 24.512e-6);
    assert_near(p.server_link_bytes, 0.5 * (8256 + 8256 + 16256 + 256));
    assert_near(p.mem_s, 56e-6);
    assert_near(p.head_s, 72e-6);
    assert_near(p.step_s, 1.072e-3);
    assert_string_equal(p.bound, "backbone");
    /* Hidden under the 1 ms backbone already at one server: link 2 x 24.128 us (one message each: (8064 +
     * 16064) / 1e9), memory 2000 x 112 / 1e9 = 224 us; the limit is 1 ms + 72 us. */
    assert_near(p.step_limit_s, 1.072e-3);
    assert_int_equal(p.servers_bw, 1);
    assert_int_equal(p.servers_mem, 1);
    assert_int_equal(p.servers, 4);
    /* Worker: 2 x 1000 x 16 = 32000; (3000 + 1003 x 4 + 6) x 4 = 28072; (12 + 1000) x 8 = 8096; push copy
     * 8000; sort 32000; no global buffers. */
    assert_near(p.worker_head_bytes, 108168);
    /* replicas = 1: each server applies its backup's pushes too (5 passes) and both copies write the undo log
     * (2 passes each): 500 rows x (7 + 5 + 4) x 16 bytes / 1e9 = 128 us. */
    in.replicas = 1;
    assert_int_equal(plan_compute(&in, &p), 0);
    assert_near(p.mem_s, 128e-6);
    in.local_mode = 0; /* global: P = 500, k = min(2000, 500) = 500, 2 x 500 / 4 = 250 rows per server */
    assert_int_equal(plan_compute(&in, &p), 0);
    assert_near(p.mem_s, 250 * (7 + 5 + 4) * 16 / 1e9);
}

/* C = 100000, D = 512, r = 0.01, W = 1, B = 1: one server needs 842063328 bytes, two 622361328 each. */
static void test_servers_for_memory(void **state)
{
    (void)state;
    plan_in in = case_a();
    in.identities = 100000;
    in.dim = 512;
    in.sample_rate = 0.01;
    in.workers = 1;
    in.batch = 1;
    /* S = 1: regions 2 x 204800000, rows 100000 x 9, margin 25600000 + 268435456, buffers 128 x (64 + 510 x
     * 2056) = 134223872 + 1000 x 2056 + 1000 x 2048 (k = 1000). */
    assert_near(plan_server_need(&in, 1, 1000), 842863328.0);
    /* S = 2: 2 x 102400000 + 50000 x 9 + 12800000 + 268435456 + 134223872 + 500 x (2056 + 2048). */
    assert_near(plan_server_need(&in, 2, 500), 622761328.0);
    /* replicas = 1 at S = 2: the table, margin, message buffers, push chunks and undo logs (2 x 512 x 4 + 16
     * bytes per pushed row) twice, the pull replies once:
     * 2 x (204800000 + 450000 + 12800000 + 268435456 + 134223872 + 500 x (2056 + 4112)) + 500 x 2048. */
    in.replicas = 1;
    assert_near(plan_server_need(&in, 2, 500), 1248610656.0);
    in.replicas = 0;
    in.server_mem_gib = 0.75; /* 805306368 bytes: between the two */
    plan_out p;
    assert_int_equal(plan_compute(&in, &p), 0);
    assert_int_equal(p.servers_mem, 2);
    in.servers = 1;
    assert_int_equal(plan_compute(&in, &p), -ENOSPC);
    /* Nothing fits 0.25 GiB: the margin alone is 256 MiB. */
    in.servers = 0;
    in.server_mem_gib = 0.25;
    assert_int_equal(plan_compute(&in, &p), -ENOSPC);
}

static void test_refusals(void **state)
{
    (void)state;
    plan_out p;
    plan_in in = case_a();
    in.sample_rate = 0;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.sample_rate = 1.5;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.workers = 0;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.wire_bytes = 3;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.link_gbps = 0;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.identities = 0;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
    in = case_a();
    in.backbone_s = -1;
    assert_int_equal(plan_compute(&in, &p), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_global_rate),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_local_sampled),
        cmocka_unit_test(test_servers_for_memory),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
