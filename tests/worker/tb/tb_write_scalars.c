/* Test helper for test_tb_events.py: writes the scalars it reads on stdin into a new event file in DIR with
 * worker/tb_writer and prints the file's path.
 *   usage: tb_write_scalars DIR < lines
 * Each line: "STEP WALL_TIME VALUE_BITS TAG" (WALL_TIME a C99 hex float such as Python's float.hex(),
 * VALUE_BITS the float32's bits in hex, so that every value -- -0.0, NaN, subnormals -- arrives exactly;
 * TAG the rest of the line, spaces included);
 * a line "flush" calls tb_flush (the end of a step). Exit 0, or 1 with pf_errmsg on stderr. */
#include "worker/tb_writer.h"

#include "common/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR < \"STEP WALL_TIME VALUE_BITS TAG\" lines\n", argv[0]);
        return 2;
    }
    tb_writer *w = NULL;
    if (tb_open(&w, argv[1]) != 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    char line[1024], wall[128];
    int64_t step;
    uint32_t bits;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "flush\n") == 0) {
            rc = tb_flush(w);
            continue;
        }
        line[strcspn(line, "\n")] = '\0';
        int at = 0;
        if (sscanf(line, "%" SCNd64 " %127s %" SCNx32 " %n", &step, wall, &bits, &at) != 3 || !line[at]) {
            fprintf(stderr, "bad line: %s\n", line);
            tb_close(w);
            return 2;
        }
        float value;
        memcpy(&value, &bits, sizeof value);
        rc = tb_scalar(w, line + at, step, strtod(wall, NULL), value);
    }
    printf("%s\n", tb_path(w));
    if (rc == 0)
        rc = tb_close(w);
    else
        tb_close(w);
    if (rc != 0) {
        fprintf(stderr, "%s\n", pf_errmsg());
        return 1;
    }
    return 0;
}
