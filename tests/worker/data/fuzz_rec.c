/* libFuzzer target for the RecordIO parser (worker/data/rec.c).
 * First input byte selects the mode:
 *   even: the rest is a .rec region; records are read one after another from byte 0 (chunks, cflag
 *         sequences, payload header, labels, class id rules);
 *   odd:  the rest is `.idx text` NUL `.rec bytes`, written to a private temp folder and opened with
 *         rec_open (index parsing, layout detection, header record, per-record checks), with and
 *         without skip_bad_records, then every image record is read back.
 *   2:    the rest is an encoded image: img_load (JPEG/PNG sniffing, TurboJPEG and libpng through
 *         pfcps's wrappers, size checks, resize, flip, normalize), twice on one decoder, so state left
 *         by a failed decode is exercised too.
 * Any crash, sanitizer report or leak is a bug: bad input must only produce error codes. */
#include "common/err.h"
#include "common/log.h"
#include "worker/data/image.h"
#include "worker/data/rec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cleanup(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/t.idx", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/t.rec", tmpdir);
    unlink(p);
    rmdir(tmpdir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR);
    /* Memory-backed when possible: two small files are written per input. */
    snprintf(tmpdir, sizeof tmpdir, "/dev/shm/pfcps-rec-fuzz-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pfcps-rec-fuzz-XXXXXX");
        if (!mkdtemp(tmpdir))
            abort();
    }
    atexit(cleanup);
    return 0;
}

static void records(const uint8_t *data, size_t size)
{
    rec_buf scratch = {0};
    uint64_t off = 0;
    for (int i = 0; i < 256 && off < size; i++) {
        const uint8_t *d;
        size_t n;
        uint64_t next;
        if (rec_read_record(data, size, off, &scratch, &d, &n, &next) < 0)
            break;
        rec_payload p;
        if (rec_parse_payload(d, n, &p) == 0) {
            int64_t c;
            volatile uint8_t sink = 0;
            (void)rec_class_of(&p, 1000, &c);
            (void)rec_class_of(&p, 0, &c);
            for (size_t k = 0; k < p.image_len; k++)
                sink ^= p.image[k];
            for (uint32_t k = 0; k < p.flag; k++)
                sink ^= (uint8_t)(rec_f32(p.labels + 4 * k) != 0);
            (void)sink;
        }
        if (next <= off)
            abort(); /* the reader must always make progress */
        off = next;
    }
    rec_buf_free(&scratch);
}

static void pack(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ni = nul ? (size_t)(nul - data) : size;
    const uint8_t *rec = nul ? nul + 1 : data + size;
    size_t nr = size - ni - (nul ? 1 : 0);
    char p[128];
    snprintf(p, sizeof p, "%s/t.idx", tmpdir);
    FILE *f = fopen(p, "wb");
    if (!f)
        abort();
    fwrite(data, 1, ni, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/t.rec", tmpdir);
    f = fopen(p, "wb");
    if (!f)
        abort();
    fwrite(rec, 1, nr, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/t", tmpdir);
    for (int skip = 0; skip < 2; skip++) {
        rec_file *rf;
        if (rec_open(&rf, p, skip ? 0 : 100, skip) < 0)
            continue;
        rec_buf s = {0};
        for (int64_t i = 0; i < rf->num_images; i++) {
            rec_payload pl;
            if (rec_get(rf, i, &s, &pl) < 0)
                abort(); /* validated at open: must read back */
        }
        rec_buf_free(&s);
        rec_close(rf);
    }
}

static img_decoder dec;
static float out[3 * IMG_SIZE * IMG_SIZE];

static void image(const uint8_t *data, size_t size)
{
    if (!dec.tj && img_decoder_init(&dec) < 0)
        abort();
    for (int k = 0; k < 2; k++) {
        int rc = img_load(&dec, data, size, IMG_SIZE, k, k, out);
        if (rc == 0)
            for (size_t i = 0; i < sizeof out / sizeof *out; i++)
                if (!(out[i] >= -1.0f && out[i] <= 1.0f))
                    abort(); /* normalized values stay in [-1, 1] */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] == 2)
        image(data + 1, size - 1);
    else if (data[0] & 1)
        pack(data + 1, size - 1);
    else
        records(data + 1, size - 1);
    return 0;
}
