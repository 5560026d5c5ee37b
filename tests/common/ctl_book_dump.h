/* Test helper: the canonical text of an address book, so books from different processes can be
 * compared byte for byte and against the text a test expects. */
#ifndef PFCPS_TESTS_COMMON_CTL_BOOK_DUMP_H
#define PFCPS_TESTS_COMMON_CTL_BOOK_DUMP_H

#include "common/ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends "role rank hex(addr)\n" for one member. */
static inline void book_dump_member(FILE *f, const char *role, int rank, const uint8_t *addr, size_t len)
{
    fprintf(f, "%s %d ", role, rank);
    for (size_t i = 0; i < len; i++)
        fprintf(f, "%02x", addr[i]);
    fputc('\n', f);
}

/* Returns a malloc'd dump: a header line, one line per member (servers then workers, by rank), then
 * the config text. */
static inline char *book_dump(const ctl_book *b)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "servers %d workers %d classes %lld\n", b->num_servers, b->num_workers,
            (long long)b->num_classes);
    for (int i = 0; i < b->num_servers; i++)
        book_dump_member(f, "server", b->servers[i].rank, b->servers[i].addr, b->servers[i].addr_len);
    for (int i = 0; i < b->num_workers; i++)
        book_dump_member(f, "worker", b->workers[i].rank, b->workers[i].addr, b->workers[i].addr_len);
    fprintf(f, "config:\n%s", b->config_text ? b->config_text : "(null)");
    fclose(f);
    return buf;
}

#endif
