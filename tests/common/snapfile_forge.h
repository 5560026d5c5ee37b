/* Forging snapfiles for the tests (common/snapfile.h layout): decode a file's header, let the caller rewrite
 * any field, encode it again and recompute what a forger can recompute: the header's SHA-256 always (it is
 * keyless), and the HMAC when the forger holds the key. The readers must then refuse the file by its fields
 * (or by the HMAC when the key is not the reader's), never by a checksum. Used by
 * tests/server/test_snapshot.c and the structure-aware fuzz target tests/common/fuzz_snapfile_fields.c. */
#ifndef PFCPS_TESTS_COMMON_SNAPFILE_FORGE_H
#define PFCPS_TESTS_COMMON_SNAPFILE_FORGE_H

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/snapfile.h"
#include "ctl.pb-c.h"

/* Decodes the header of the snapfile bytes buf[0, len): NULL when there is no decodable one (free the result
 * with pfcps__snapshot_header__free_unpacked). */
static inline Pfcps__SnapshotHeader *forge_decode(const uint8_t *buf, size_t len)
{
    if (len < SNAPFILE_HDR_AREA || memcmp(buf, "PFCPSNP1", 8) != 0)
        return NULL;
    uint32_t hl =
        (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
    if (hl == 0 || hl > SNAPFILE_HDR_AREA - 12 - 64)
        return NULL;
    return pfcps__snapshot_header__unpack(NULL, hl, buf + 12);
}

/* Writes header h into the header area of buf (len >= 4096): length, the message, its SHA-256, and its HMAC
 * under key when key is not NULL and h->authenticated (else zeros), zero padding. Returns 0, or -1 when the
 * message does not fit the area. */
static inline int forge_encode(uint8_t *buf, const Pfcps__SnapshotHeader *h, const snapfile_key *key)
{
    size_t hl = pfcps__snapshot_header__get_packed_size(h);
    if (hl == 0 || hl > SNAPFILE_HDR_AREA - 12 - 64)
        return -1;
    memset(buf + 8, 0, SNAPFILE_HDR_AREA - 8);
    for (int i = 0; i < 4; i++)
        buf[8 + i] = (uint8_t)(hl >> (8 * i));
    pfcps__snapshot_header__pack(h, buf + 12);
    unsigned int dl = 0;
    EVP_Digest(buf + 12, hl, buf + 12 + hl, &dl, EVP_sha256(), NULL);
    if (key && h->authenticated)
        HMAC(EVP_sha256(), key->k, sizeof key->k, buf + 12, hl, buf + 12 + hl + 32, &dl);
    return 0;
}

/* Reads the file at path into a malloc'd buffer (*len bytes); NULL on failure. */
static inline uint8_t *forge_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = b ? (size_t)n : 0;
    return b;
}

/* Rewrites the header of the snapfile at path in place: edit(h, arg) changes the decoded fields, then the
 * header's SHA-256 and (key not NULL) its HMAC are recomputed. Returns 0 or -1 (unreadable, undecodable,
 * too large, unwritable). */
static inline int forge_file(const char *path, void (*edit)(Pfcps__SnapshotHeader *h, void *arg), void *arg,
                             const snapfile_key *key)
{
    size_t len = 0;
    uint8_t *b = forge_read(path, &len);
    Pfcps__SnapshotHeader *h = b ? forge_decode(b, len) : NULL;
    int rc = -1;
    if (h) {
        edit(h, arg);
        rc = forge_encode(b, h, key);
        pfcps__snapshot_header__free_unpacked(h, NULL);
    }
    if (rc == 0) {
        FILE *f = fopen(path, "wb");
        rc = f && fwrite(b, 1, len, f) == len ? 0 : -1;
        if (f && fclose(f) != 0)
            rc = -1;
    }
    free(b);
    return rc;
}

#endif
