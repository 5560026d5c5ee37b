/* common/member_addr.h with the parts a CUDA run's worker 0 packs: its two endpoint names and the
 * 128-byte NCCL unique id (worker/train.c). The packed form (u8 count, then u8 length + bytes per part) is
 * rebuilt here by hand and compared byte for byte; the address must fit CTL_MAX_ADDR for realistic names
 * (verbs;ofi_rxm names are sockaddr_in6-sized, 28 bytes here; 100 bytes each also fit, which the former
 * 256-byte limit refused); parts that cannot fit are refused with -ENOSPC; malformed addresses from the
 * network (count beyond the parts, a length overrunning the buffer, an empty buffer) with -EPROTO. */
#include <errno.h>
#include <string.h>

#include "common/ctl.h"
#include "common/err.h"
#include "common/member_addr.h"
#include "tests/check.h"

#define NCCL_ID 128 /* CUDA_NCCL_ID_BYTES */

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + 7 * i);
}

static void round_trip(size_t l0, size_t l1)
{
    uint8_t a0[255], a1[255], id[NCCL_ID], out[CTL_MAX_ADDR], want[CTL_MAX_ADDR];
    fill(a0, l0, 1);
    fill(a1, l1, 2);
    fill(id, sizeof id, 3);
    const void *parts[3] = {a0, a1, id};
    size_t lens[3] = {l0, l1, NCCL_ID};
    int n = member_addr_pack(out, sizeof out, 3, parts, lens);
    size_t want_n = 1 + (1 + l0) + (1 + l1) + (1 + NCCL_ID);
    CHECK(n == (int)want_n, "names %zu + %zu: packed %d bytes, want %zu (%s)", l0, l1, n, want_n,
          pf_errmsg());
    if (n != (int)want_n)
        return;
    /* by hand */
    size_t o = 0;
    want[o++] = 3;
    want[o++] = (uint8_t)l0;
    memcpy(want + o, a0, l0), o += l0;
    want[o++] = (uint8_t)l1;
    memcpy(want + o, a1, l1), o += l1;
    want[o++] = NCCL_ID;
    memcpy(want + o, id, NCCL_ID), o += NCCL_ID;
    CHECK(o == want_n && !memcmp(out, want, o), "names %zu + %zu: packed bytes differ from the layout", l0,
          l1);
    for (int i = 0; i < 3; i++) {
        const void *p;
        size_t pl;
        CHECK(member_addr_part(out, (size_t)n, i, &p, &pl) == 0 && pl == lens[i] && !memcmp(p, parts[i], pl),
              "names %zu + %zu: part %d not read back", l0, l1, i);
    }
    printf("names %3zu + %3zu bytes + NCCL id: %3d of %d bytes\n", l0, l1, n, CTL_MAX_ADDR);
}

int main(void)
{
    round_trip(16, 16);   /* tcp;ofi_rxm over IPv4 */
    round_trip(28, 28);   /* sockaddr_in6 */
    round_trip(100, 100); /* did not fit the former 256-byte CTL_MAX_ADDR */
    /* Parts that cannot fit: two 255-byte names and the id need 1 + 256 + 256 + 129 bytes. */
    uint8_t big[255] = {0}, id[NCCL_ID] = {0}, out[CTL_MAX_ADDR];
    const void *parts[3] = {big, big, id};
    size_t lens[3] = {255, 255, NCCL_ID};
    CHECK(member_addr_pack(out, sizeof out, 3, parts, lens) == -ENOSPC && strstr(pf_errmsg(), "does not fit"),
          "oversized parts: %s", pf_errmsg());
    size_t too_long[1] = {256};
    CHECK(member_addr_pack(out, sizeof out, 1, parts, too_long) == -ENOSPC, "a 256-byte part was packed");
    /* Malformed addresses. */
    uint8_t a[8] = {3, 2, 'a', 'b', 2, 'c', 'd', 0};
    const void *p;
    size_t pl;
    CHECK(member_addr_part(a, 7, 1, &p, &pl) == 0 && pl == 2 && !memcmp(p, "cd", 2),
          "part 1 of a good address");
    CHECK(member_addr_part(a, 7, 2, &p, &pl) == -EPROTO, "part 2 overruns (count 3, two parts present)");
    CHECK(member_addr_part(a, 7, 3, &p, &pl) == -EPROTO, "part 3 beyond the count");
    CHECK(member_addr_part(a, 5, 1, &p, &pl) == -EPROTO, "part 1 cut short");
    CHECK(member_addr_part(a, 0, 0, &p, &pl) == -EPROTO, "empty address");
    CHECK(member_addr_part(a, 7, -1, &p, &pl) == -EPROTO, "negative part");
    printf("%s\n", fails ? "FAILED" : "member addresses as specified");
    return fails != 0;
}
