/* How a test reports a missing reference or Python dependency, in one place for the C tests.
 * The reference folder is $PFCPS_REFERENCE (tests/meson.build: <builddir>/tests/reference, written by
 * tests/reference/make_reference.py at build time, or ../shared/reference for the *_shared tests). Where the
 * generator could not run (no torch or numpy) it left <folder>/MISSING saying why.
 * A missing reference is a SKIP (exit 77) naming what is missing, except under PFCPS_REQUIRE_REFERENCES=1
 * (set by .ci/run), where it is a FAIL (exit 1): CI cannot pass without its references. Header-only; C and
 * C++ (tests/kernels/cuda/test_cuda_head_emu.cpp). */
#ifndef PFCPS_TESTS_REFERENCE_REF_H
#define PFCPS_TESTS_REFERENCE_REF_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 1 when PFCPS_REQUIRE_REFERENCES is set to anything but "" or "0". */
static inline int ref_required(void)
{
    const char *v = getenv("PFCPS_REQUIRE_REFERENCES");
    return v && *v && strcmp(v, "0") != 0;
}

/* Reports that a reference or Python dependency is missing, printf-style: prints "SKIP: <why>" and returns
 * 77, or under PFCPS_REQUIRE_REFERENCES=1 prints "FAIL: <why> (...)" and returns 1. The caller returns
 * (or counts) the result. */
static inline int ref_missing(const char *fmt, ...)
{
    char why[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (ref_required()) {
        printf("FAIL: %s (PFCPS_REQUIRE_REFERENCES=1: a missing reference or Python dependency fails)\n",
               why);
        return 1;
    }
    printf("SKIP: %s\n", why);
    return 77;
}

/* dir (size bytes) = $PFCPS_REFERENCE/sub (sub "" for the folder itself). Returns 0 when that folder exists
 * and the generator left no MISSING record in $PFCPS_REFERENCE; else -1 with why (why_size bytes) naming the
 * cause: PFCPS_REFERENCE not set, the MISSING record, or the folder absent. Prints nothing. */
static inline int ref_locate(char *dir, size_t size, const char *sub, char *why, size_t why_size)
{
    const char *root = getenv("PFCPS_REFERENCE");
    if (!root || !*root) {
        snprintf(dir, size, "%s", sub);
        snprintf(why, why_size, "PFCPS_REFERENCE not set (tests/meson.build sets it)");
        return -1;
    }
    snprintf(dir, size, "%s%s%s", root, *sub ? "/" : "", sub);
    char path[1200], rec[600] = "";
    snprintf(path, sizeof path, "%s/MISSING", root);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(rec, 1, sizeof rec - 1, f);
        fclose(f);
        while (n > 0 && (rec[n - 1] == '\n' || rec[n - 1] == ' '))
            n--;
        rec[n] = 0;
        snprintf(why, why_size, "references not generated in %s: %s", root, rec);
        return -1;
    }
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    snprintf(why, why_size, "reference folder %s missing", dir);
    return -1;
}

/* ref_locate, reporting a missing folder through ref_missing: 0 when dir exists, else 77 (SKIP) or 1 (FAIL
 * under PFCPS_REQUIRE_REFERENCES=1), printed. */
static inline int ref_dir(char *dir, size_t size, const char *sub)
{
    char why[2048];
    return ref_locate(dir, size, sub, why, sizeof why) ? ref_missing("%s", why) : 0;
}

/* For a test whose other parts run without the reference: prints "note: <why>: that part not run" and returns
 * 0, or under PFCPS_REQUIRE_REFERENCES=1 prints "FAIL: <why>" and returns 1 (the caller counts it). */
static inline int ref_part_missing(const char *why)
{
    if (ref_required()) {
        printf("FAIL: %s (PFCPS_REQUIRE_REFERENCES=1: a missing reference or Python dependency fails)\n",
               why);
        return 1;
    }
    printf("note: %s: that part not run\n", why);
    return 0;
}

/* *py = $PFCPS_PYTHON (tests/pyenv.sh's venv). Returns 0 when it is an executable; else ref_missing's result
 * (77 or 1, printed) naming what is missing. */
static inline int ref_python(const char **py)
{
    *py = getenv("PFCPS_PYTHON");
    if (!*py || !**py)
        return ref_missing("PFCPS_PYTHON is not set (tests/pyenv.sh makes it)");
    if (access(*py, X_OK) != 0)
        return ref_missing("PFCPS_PYTHON=%s is not an executable (tests/pyenv.sh)", *py);
    return 0;
}

#endif
