/* Run configuration: the table of known keys, inih parsing, `--set` overrides, validation, the INI
 * writer and arcface_torch's startup dump. See common/config.h and docs/configuration.md. */
#include "common/config.h"

#include "common/err.h"
#include "common/file.h"
#include "common/netname.h"
#include "common/hostport.h"
#include "common/metrics.h"
#include "common/log.h"

#include <ini.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { K_INT, K_I64, K_DOUBLE, K_BOOL, K_STR, K_F3 } key_type;

/* A range on a number: lo/hi inclusive unless the *_open flag says exclusive. */
typedef struct key_def {
    const char *name;
    const char *section;
    key_type type;
    size_t off;
    const char *def; /* default as text, parsed by the same code as a file value */
    double lo, hi;   /* numeric range (for K_F3: each element) */
    int lo_open, hi_open;
    const char *choices; /* K_STR: space-separated allowed values, NULL = any */
    int required;        /* must be set (num_classes > 0, rec non-empty) */
    int nonempty;        /* K_STR: "" not allowed */
} key_def;

#define OFF(f) offsetof(pf_config, f)
#define BIG    1e18

/* The known keys, in the order cfg_to_ini and cfg_log write them. Help text lives in
 * docs/configuration.md. */
static const key_def keys[] = {
    /* [train] */
    {"network", "train", K_STR, OFF(network), "r50", 0, 0, 0, 0, NULL, 0, 1},
    {"embedding_size", "train", K_INT, OFF(embedding_size), "512", 1, 65536, 0, 0, NULL, 0, 0},
    {"sample_rate", "train", K_DOUBLE, OFF(sample_rate), "1.0", 0, 1, 0, 0, NULL, 0, 0},
    {"margin_list", "train", K_F3, OFF(margin_list), "1.0, 0.5, 0.0", -10, 10, 0, 0, NULL, 0, 0},
    {"scale", "train", K_DOUBLE, OFF(scale), "64", 0, 1e6, 1, 0, NULL, 0, 0},
    {"interclass_filtering_threshold", "train", K_DOUBLE, OFF(interclass_filtering_threshold), "0", 0, 1, 0,
     1, NULL, 0, 0},
    {"margin_grad", "train", K_STR, OFF(margin_grad), "straight_through", 0, 0, 0, 0,
     "straight_through exact", 0, 1},
    {"sample_rounding", "train", K_STR, OFF(sample_rounding), "floor", 0, 0, 0, 0, "floor ceil", 0, 1},
    {"margin_combine", "train", K_STR, OFF(margin_combine), "arcface_torch", 0, 0, 0, 0, "arcface_torch full",
     0, 1},
    {"pfc_update", "train", K_STR, OFF(pfc_update), "dense", 0, 0, 0, 0, "dense sparse", 0, 1},
    {"fp16", "train", K_BOOL, OFF(fp16), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"bf16", "train", K_BOOL, OFF(bf16), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"fp16_overflow_skip", "train", K_STR, OFF(fp16_overflow_skip), "step", 0, 0, 0, 0, "step backbone", 0,
     1},
    {"backbone_grad_comm", "train", K_STR, OFF(backbone_grad_comm), "fp16", 0, 0, 0, 0, "fp16 fp32", 0, 1},
    {"device", "train", K_STR, OFF(device), "cpu", 0, 0, 0, 0, "cpu cuda cpu-fenced cpu-bf16", 0, 1},
    {"optimizer", "train", K_STR, OFF(optimizer), "sgd", 0, 0, 0, 0, "sgd adamw", 0, 1},
    {"lr", "train", K_DOUBLE, OFF(lr), "0.1", 0, 1e3, 1, 0, NULL, 0, 0},
    {"momentum", "train", K_DOUBLE, OFF(momentum), "0.9", 0, 1, 0, 1, NULL, 0, 0},
    {"weight_decay", "train", K_DOUBLE, OFF(weight_decay), "5e-4", 0, 1, 0, 0, NULL, 0, 0},
    {"batch_size", "train", K_INT, OFF(batch_size), "128", 1, 1 << 20, 0, 0, NULL, 0, 0},
    {"gradient_acc", "train", K_INT, OFF(gradient_acc), "1", 1, 1 << 20, 0, 0, NULL, 0, 0},
    {"num_classes", "train", K_I64, OFF(num_classes), "0", 0, 1e15, 0, 0, NULL, 1, 0},
    {"num_image", "train", K_I64, OFF(num_image), "0", 0, 1e15, 0, 0, NULL, 0, 0},
    {"num_epoch", "train", K_INT, OFF(num_epoch), "20", 1, 1e6, 0, 0, NULL, 0, 0},
    {"warmup_epoch", "train", K_DOUBLE, OFF(warmup_epoch), "0", -1e6, 1e6, 0, 0, NULL, 0, 0},
    {"lr_scheduler", "train", K_STR, OFF(lr_scheduler), "polynomial_lr_warmup", 0, 0, 0, 0,
     "polynomial_lr_warmup poly_scheduler", 0, 1},
    {"pretrained", "train", K_STR, OFF(pretrained), "", 0, 0, 0, 0, NULL, 0, 0},
    {"pretrained_centers", "train", K_STR, OFF(pretrained_centers), "", 0, 0, 0, 0, NULL, 0, 0},
    /* [data] */
    {"rec", "data", K_STR, OFF(rec), "", 0, 0, 0, 0, NULL, 1, 0},
    {"synthetic", "data", K_STR, OFF(synthetic), "arcface_torch", 0, 0, 0, 0, "arcface_torch varied", 0, 1},
    {"frequent", "data", K_INT, OFF(frequent), "10", 1, INT_MAX, 0, 0, NULL, 0, 0},
    {"verbose", "data", K_INT, OFF(verbose), "2000", 1, INT_MAX, 0, 0, NULL, 0, 0},
    {"output", "data", K_STR, OFF(output), "work_dirs/pfcps", 0, 0, 0, 0, NULL, 0, 1},
    {"seed", "data", K_I64, OFF(seed), "2048", 0, 9.2e18, 0, 0, NULL, 0, 0},
    {"num_workers", "data", K_INT, OFF(num_workers), "2", 0, 256, 0, 0, NULL, 0, 0},
    {"resume", "data", K_BOOL, OFF(resume), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"resume_run", "data", K_STR, OFF(resume_run), "", 0, 0, 0, 0, NULL, 0, 0},
    {"save_all_states", "data", K_BOOL, OFF(save_all_states), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"skip_bad_records", "data", K_BOOL, OFF(skip_bad_records), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"resize", "data", K_BOOL, OFF(resize), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"val_targets", "data", K_STR, OFF(val_targets), "", 0, 0, 0, 0, NULL, 0, 0},
    {"save_centers", "data", K_BOOL, OFF(save_centers), "false", 0, 1, 0, 0, NULL, 0, 0},
    {"log_format", "data", K_STR, OFF(log_format), "pfcps", 0, 0, 0, 0, "pfcps arcface_torch", 0, 1},
    /* [cluster] */
    {"servers", "cluster", K_INT, OFF(servers), "1", 1, 65536, 0, 0, NULL, 0, 0},
    {"workers", "cluster", K_INT, OFF(workers), "1", 1, 65536, 0, 0, NULL, 0, 0},
    {"provider", "cluster", K_STR, OFF(provider), "tcp", 0, 0, 0, 0, "tcp shm verbs", 0, 1},
    {"rendezvous", "cluster", K_STR, OFF(rendezvous), "127.0.0.1:29500", 0, 0, 0, 0, NULL, 0, 1},
    {"wire_dtype", "cluster", K_STR, OFF(wire_dtype), "fp32", 0, 0, 0, 0, "fp32 fp16 bf16", 0, 1},
    {"max_staleness", "cluster", K_INT, OFF(max_staleness), "0", 0, 1e6, 0, 0, NULL, 0, 0},
    {"head_mode", "cluster", K_STR, OFF(head_mode), "global", 0, 0, 0, 0, "global local", 0, 1},
    {"secret", "cluster", K_STR, OFF(secret), "", 0, 0, 0, 0, NULL, 0, 0},
    {"ctl_max_frame", "cluster", K_INT, OFF(ctl_max_frame), "1048576", 1024, 1 << 30, 0, 0, NULL, 0, 0},
    {"data_address", "cluster", K_STR, OFF(data_address), "auto", 0, 0, 0, 0, NULL, 0, 1},
    {"metrics_address", "cluster", K_STR, OFF(metrics_address), "", 0, 0, 0, 0, NULL, 0, 0},
    {"ctl_timeout", "cluster", K_DOUBLE, OFF(ctl_timeout), "30", 1, 86400, 0, 0, NULL, 0, 0},
    {"join_timeout", "cluster", K_DOUBLE, OFF(join_timeout), "600", 0, 86400, 1, 0, NULL, 0, 0},
    /* [server] */
    {"snapshot_dir", "server", K_STR, OFF(snapshot_dir), "", 0, 0, 0, 0, NULL, 0, 0},
    {"snapshot_every", "server", K_INT, OFF(snapshot_every), "0", 0, INT_MAX, 0, 0, NULL, 0, 0},
    {"snapshot_keep", "server", K_INT, OFF(snapshot_keep), "2", 1, 1000000, 0, 0, NULL, 0, 0},
    {"replicas", "server", K_INT, OFF(replicas), "0", 0, 1, 0, 0, NULL, 0, 0},
    {"on_member_loss", "server", K_STR, OFF(on_member_loss), "exit", 0, 0, 0, 0, "exit serve", 0, 1},
    {"apply_threads", "server", K_INT, OFF(apply_threads), "2", 1, 1024, 0, 0, NULL, 0, 0},
    {"center_init", "server", K_STR, OFF(center_init), "eager", 0, 0, 0, 0, "eager lazy", 0, 1},
};
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

static const key_def *find_key(const char *name)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* Levenshtein distance (two-row dynamic programme), capped at 64 characters per word. */
static int edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64)
        return 1000;
    int prev[65], cur[65];
    for (size_t j = 0; j <= m; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}

/* The closest known key within distance max(2, len/3), or NULL. */
static const char *did_you_mean(const char *name)
{
    int best = 1000;
    const char *best_name = NULL;
    for (int i = 0; i < NKEYS; i++) {
        int d = edit_distance(name, keys[i].name);
        if (d < best) {
            best = d;
            best_name = keys[i].name;
        }
    }
    int limit = (int)strlen(name) / 3;
    if (limit < 2)
        limit = 2;
    return best <= limit ? best_name : NULL;
}

static int in_range(const key_def *k, double v)
{
    if (k->lo_open ? !(v > k->lo) : !(v >= k->lo))
        return 0;
    if (k->hi_open ? !(v < k->hi) : !(v <= k->hi))
        return 0;
    return 1;
}

static int range_err(const key_def *k, const char *text)
{
    return pf_err(-ERANGE, "key '%s': value %s is out of range: must be in %c%.17g, %.17g%c", k->name, text,
                  k->lo_open ? '(' : '[', k->lo, k->hi, k->hi_open ? ')' : ']');
}

/* Copies `s` without surrounding blanks into `out` (size `cap`); 0 or -1 when it does not fit. */
static int trim_copy(const char *s, size_t n, char *out, size_t cap)
{
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        n--;
    if (n + 1 > cap)
        return -1;
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (!*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_i64(const char *s, long long *out)
{
    if (!*s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE)
        return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

/* Is `v` one of the space-separated words in `choices`? */
static int is_choice(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

/* Range and choice checks of one key on the value stored in `cfg` (shared by set and validate). */
static int check_key(const pf_config *cfg, const key_def *k, int check_required)
{
    const char *base = (const char *)cfg + k->off;
    char text[64];
    switch (k->type) {
    case K_INT: {
        int v = *(const int *)(const void *)base;
        snprintf(text, sizeof text, "%d", v);
        if (check_required && k->required && v <= 0)
            return pf_err(-EINVAL, "missing required key '%s' (must be set to a positive value)", k->name);
        if (!in_range(k, v))
            return range_err(k, text);
        break;
    }
    case K_I64: {
        int64_t v = *(const int64_t *)(const void *)base;
        snprintf(text, sizeof text, "%lld", (long long)v);
        if (k->required && v <= 0) {
            if (check_required)
                return pf_err(-EINVAL, "missing required key '%s' (must be set to a positive value)",
                              k->name);
            if (v < 0)
                return range_err(k, text);
            break;
        }
        if (!in_range(k, (double)v))
            return range_err(k, text);
        break;
    }
    case K_DOUBLE: {
        double v = *(const double *)(const void *)base;
        snprintf(text, sizeof text, "%.17g", v);
        if (!in_range(k, v))
            return range_err(k, text);
        break;
    }
    case K_BOOL: break;
    case K_F3: {
        const double *v = (const double *)(const void *)base;
        for (int i = 0; i < 3; i++) {
            snprintf(text, sizeof text, "%.17g", v[i]);
            if (!isfinite(v[i]) || !in_range(k, v[i]))
                return pf_err(-ERANGE, "key '%s': element %d value %s is out of range: must be in [%g, %g]",
                              k->name, i + 1, text, k->lo, k->hi);
        }
        break;
    }
    case K_STR: {
        const char *s = base;
        if (check_required && k->required && !*s)
            return pf_err(-EINVAL, "missing required key '%s' (must be set, e.g. --set %s=...)", k->name,
                          k->name);
        if (k->nonempty && !*s)
            return pf_err(-EINVAL, "key '%s': value must not be empty", k->name);
        if (k->choices && !is_choice(k->choices, s))
            return pf_err(-EINVAL, "key '%s': value '%s' is not one of: %s", k->name, s, k->choices);
        if (strcmp(k->name, "network") == 0 && *s) {
            pf_network_name nn;
            int rc = pf_network_parse(s, &nn);
            if (rc < 0)
                return pf_err_wrap(rc, "key 'network'");
        }
        if (strcmp(k->name, "rendezvous") == 0) {
            char host[CFG_STR];
            int port;
            if (pf_parse_hostport(s, host, sizeof host, &port) < 0)
                return pf_err(-EINVAL, "key 'rendezvous': value '%s' is not host:port with port 1-65535", s);
        }
        if (strcmp(k->name, "metrics_address") == 0 && *s) {
            char host[CFG_STR];
            int port;
            if (metrics_parse_address(s, host, sizeof host, &port) < 0)
                return pf_err(-EINVAL, "key 'metrics_address': value '%s' is not host:port with port 0-65535 "
                              "(an IPv6 address in brackets; \"\" = off)", s);
        }
        break;
    }
    }
    return 0;
}

/* K_F3 text: "1.0, 0.5, 0.0", optionally in () or [] as in arcface_torch's Python configs, into x[3].
 * Returns 0 or -EINVAL naming the key. */
static int parse_f3(const key_def *k, const char *v, double x[3])
{
    char buf[CFG_STR];
    size_t n = strlen(v);
    const char *s = v;
    if (n >= 2 && ((v[0] == '(' && v[n - 1] == ')') || (v[0] == '[' && v[n - 1] == ']'))) {
        s = v + 1;
        n -= 2;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    int cnt = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char t[CFG_STR];
        trim_copy(tok, strlen(tok), t, sizeof t);
        if (cnt >= 3) {
            cnt++;
            break;
        }
        if (parse_double(t, &x[cnt]) < 0)
            return pf_err(-EINVAL,
                          "key '%s': element '%s' of '%s' is not a number (expected 3 numbers "
                          "like '1.0, 0.5, 0.0')",
                          k->name, t, v);
        cnt++;
    }
    if (cnt != 3)
        return pf_err(-EINVAL, "key '%s': '%s' is not a list of exactly 3 numbers (like '1.0, 0.5, 0.0')",
                      k->name, v);
    return 0;
}

/* Is `s` what may follow a value on its line: nothing, or blanks then a ';' comment? */
static int is_comment_tail(const char *s)
{
    if (!*s)
        return 1;
    if (*s != ' ' && *s != '\t')
        return 0;
    while (*s == ' ' || *s == '\t')
        s++;
    return !*s || *s == ';';
}

/* The value text of an INI line, its inline comment cut (inih runs with inline comments off: inih_setup).
 * A value that starts with a quote runs to the first matching quote after which the line holds nothing or
 * blanks and a ';' comment, quotes kept (parse_str removes them): `output = "/tmp/a ;b" ; note` is
 * "/tmp/a ;b" in quotes. Any other value is cut at the first ';' after a blank, as inih cuts it, and a value
 * that starts with ';' is a comment (`pretrained = ; none`). Returns 0, or -1 when it does not fit `cap`. */
static int ini_value(const char *v, char *out, size_t cap)
{
    size_t n = strlen(v), end = n;
    if (v[0] == '"' || v[0] == '\'') {
        for (size_t q = 1; q < n; q++)
            if (v[q] == v[0] && is_comment_tail(v + q + 1))
                return trim_copy(v, q + 1, out, cap);
    }
    if (v[0] == ';')
        end = 0;
    for (size_t i = 1; i < end; i++)
        if (v[i] == ';' && (v[i - 1] == ' ' || v[i - 1] == '\t'))
            end = i;
    return trim_copy(v, end, out, cap);
}

/* Value text without its one pair of matching quotes ("r50" as in a Python config), into s (`cap` bytes).
 * Returns 0, or -1 when it does not fit. */
static int unquote(const char *v, char *s, size_t cap)
{
    size_t n = strlen(v);
    if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0])
        v++, n -= 2;
    if (n + 1 > cap)
        return -1;
    memcpy(s, v, n);
    s[n] = '\0';
    return 0;
}

/* How cfg_to_ini writes the string value s so that the parser (ini_value, then unquote) reads back exactly s:
 * 0 bare, or the quote character to wrap it in; -1 when neither quote works (a value holding ' ;' and both
 * kinds of quote followed by a comment-like tail). Blanks at the ends, a leading quote or ';', and ' ;' need
 * the quotes. */
static int str_quote(const char *s)
{
    size_t n = strlen(s);
    int must = n > 0 && (s[0] == ' ' || s[0] == '"' || s[0] == '\'' || s[0] == ';' || s[n - 1] == ' ');
    static const int how[] = {0, '"', '\''};
    for (int i = must ? 1 : 0; i < 3; i++) {
        char text[CFG_STR + 8], line[CFG_STR + 8], back[CFG_STR + 8];
        if (how[i])
            snprintf(text, sizeof text, "%c%s%c", how[i], s, how[i]);
        else
            snprintf(text, sizeof text, "%s", s);
        if (ini_value(text, line, sizeof line) == 0 && unquote(line, back, sizeof back) == 0 &&
            !strcmp(back, s))
            return how[i];
    }
    return -1;
}

/* K_STR text into s[CFG_STR]: one pair of matching quotes is removed ("r50" as in a Python config); control
 * characters and values INI cannot write back are refused. Returns 0 or -EINVAL naming the key. */
static int parse_str(const key_def *k, const char *v, char s[CFG_STR])
{
    (void)unquote(v, s, CFG_STR); /* fits: cfg_set bounds v (CFG_STR - 1 characters, or + 2 quotes) */
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return pf_err(-EINVAL, "key '%s': value contains a control character", k->name);
    if (str_quote(s) < 0)
        return pf_err(
            -EINVAL,
            "key '%s': value contains ' ;' (which INI reads as a comment) and both kinds of quote: it "
            "cannot be written back",
            k->name);
    return 0;
}

/* Stores `size` bytes of a parsed value into key k's field and checks the key (check_key); on failure the
 * field gets its old value back. Returns 0 or check_key's error. */
static int store_checked(pf_config *cfg, const key_def *k, const void *val, size_t size)
{
    _Static_assert(CFG_STR >= 3 * sizeof(double), "a field's old value fits the buffer");
    char *base = (char *)cfg + k->off;
    char old[CFG_STR];
    memcpy(old, base, size);
    memcpy(base, val, size);
    int rc = check_key(cfg, k, 0);
    if (rc < 0)
        memcpy(base, old, size);
    return rc;
}

/* Parses the (trimmed) value text v by key k's type and stores it (store_checked; booleans have no range). */
static int set_typed(pf_config *cfg, const key_def *k, const char *v)
{
    switch (k->type) {
    case K_INT:
    case K_I64: {
        long long x;
        if (parse_i64(v, &x) < 0)
            return pf_err(-EINVAL, "key '%s': '%s' is not an integer", k->name, v);
        if (k->type == K_I64) {
            int64_t y = (int64_t)x;
            return store_checked(cfg, k, &y, sizeof y);
        }
        if (x < INT_MIN || x > INT_MAX)
            return range_err(k, v);
        int y = (int)x;
        return store_checked(cfg, k, &y, sizeof y);
    }
    case K_DOUBLE: {
        double x;
        if (parse_double(v, &x) < 0)
            return pf_err(-EINVAL, "key '%s': '%s' is not a (finite) number", k->name, v);
        return store_checked(cfg, k, &x, sizeof x);
    }
    case K_BOOL: {
        int b;
        if (parse_bool(v, &b) < 0)
            return pf_err(-EINVAL, "key '%s': '%s' is not a boolean (true/false, 1/0, yes/no, on/off)",
                          k->name, v);
        *(int *)(void *)((char *)cfg + k->off) = b;
        return 0;
    }
    case K_F3: {
        double x[3];
        int rc = parse_f3(k, v, x);
        return rc < 0 ? rc : store_checked(cfg, k, x, sizeof x);
    }
    case K_STR: {
        char s[CFG_STR];
        int rc = parse_str(k, v, s);
        return rc < 0 ? rc : store_checked(cfg, k, s, strlen(s) + 1);
    }
    }
    return pf_err(-EINVAL, "key '%s': unsupported type", k->name);
}

int cfg_set(pf_config *cfg, const char *key, const char *value)
{
    char kname[CFG_STR];
    if (trim_copy(key, strlen(key), kname, sizeof kname) < 0 || !*kname)
        return pf_err(-EINVAL, "empty or overlong key name");
    const key_def *k = find_key(kname);
    if (!k) {
        const char *s = did_you_mean(kname);
        if (s)
            return pf_err(-EINVAL, "unknown key '%s' (did you mean '%s'?)", kname, s);
        return pf_err(-EINVAL, "unknown key '%s'", kname);
    }
    /* Up to CFG_STR - 1 characters; a string in quotes may have two more (the quotes, which parse_str
     * removes), so that every value cfg_to_ini writes reads back. */
    char v[CFG_STR + 2];
    int fits = trim_copy(value, strlen(value), v, sizeof v) == 0;
    size_t n = fits ? strlen(v) : 0;
    int quoted = n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0];
    if (!fits || (n > CFG_STR - 1 && !(k->type == K_STR && quoted)))
        return pf_err(-EINVAL, "key '%s': value is longer than %d characters", k->name, CFG_STR - 1);
    return set_typed(cfg, k, v);
}

void cfg_defaults(pf_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < NKEYS; i++)
        (void)cfg_set(cfg, keys[i].name, keys[i].def); /* the defaults are in range by construction */
}

static int validate(const pf_config *cfg, int check_required)
{
    for (int i = 0; i < NKEYS; i++) {
        int rc = check_key(cfg, &keys[i], check_required);
        if (rc < 0)
            return rc;
    }
    if (cfg->fp16 && cfg->bf16)
        return pf_err(-EINVAL,
                      "keys 'fp16' and 'bf16' are both true: mixed precision is fp16 (with loss scaling) "
                      "or bf16, set one of them");
    /* worker/lr_schedule.c's rule (warmup steps shorter than the total steps), in epochs: refused here so
     * that pfcps config-get and every daemon refuse it at once, not the workers after the run formed. */
    if (cfg->warmup_epoch > 0 && cfg->warmup_epoch >= cfg->num_epoch)
        return pf_err(
            -ERANGE,
            "key 'warmup_epoch': warmup %g epochs is not shorter than num_epoch %d (the lr schedule "
            "needs warmup shorter than training)",
            cfg->warmup_epoch, cfg->num_epoch);
    /* worker/head/head.c's rule for margin_combine = arcface_torch (CombinedMarginLoss raises on such a
     * triple), refused here so that every member (and pfcps config-get) refuses it before joining, not the
     * workers after the run formed. */
    if (strcmp(cfg->margin_combine, "full") != 0 && !(cfg->margin_list[2] > 0) && cfg->margin_list[0] != 1.0)
        return pf_err(-EINVAL,
                      "key 'margin_list': (%g, %g, %g): arcface_torch's CombinedMarginLoss has no such margin (m1 "
                      "must be 1 unless m3 > 0); margin_combine = full computes cos(m1 theta + m2) - m3",
                      cfg->margin_list[0], cfg->margin_list[1], cfg->margin_list[2]);
    /* Whenever num_classes is given (not only where it is required): pfcps config-get, which the local
     * launcher runs first, then refuses the config at once instead of server 0 alone while the others wait to
     * join. */
    if (cfg->num_classes > 0 && cfg->num_classes < cfg->servers)
        return pf_err(-ERANGE, "key 'servers': %d servers for num_classes %lld leaves a shard empty",
                      cfg->servers, (long long)cfg->num_classes);
    if (cfg->resume_run[0] &&
        (strlen(cfg->resume_run) != 32 || strspn(cfg->resume_run, "0123456789abcdefABCDEF") != 32))
        return pf_err(-EINVAL,
                      "key 'resume_run': '%.80s' is not a run id (32 hex digits, as `pfcps ckpt-info` and "
                      "server 0's \"run id\" log line give it)",
                      cfg->resume_run);
    if (cfg->resume_run[0] && !cfg->resume)
        return pf_err(-EINVAL,
                      "key 'resume_run' is set but resume = false: it names the run whose checkpoints a "
                      "resume takes (set resume = true, or leave resume_run empty to start a new run)");
    if (cfg->replicas > 0 && cfg->servers < 2)
        return pf_err(-ERANGE,
                      "key 'replicas': a hot-standby copy of each shard lives on another server, so "
                      "replicas = %d needs servers >= 2 (servers = %d)",
                      cfg->replicas, cfg->servers);
    return 0;
}

int cfg_validate(const pf_config *cfg)
{
    return validate(cfg, 1);
}

int cfg_validate_ranges(const pf_config *cfg)
{
    return validate(cfg, 0);
}

#define CFG_MAX_LINE 4096 /* longest line of a config file (check_lines) */

/* inih handler state: the first error wins; inih returns its line number. */
typedef struct parse_state {
    pf_config *cfg;
    int rc;
    char msg[PF_ERRMSG_MAX];
} parse_state;

static int cfg_ini_handler(void *user, const char *section, const char *name, const char *value)
{
    (void)section;
    parse_state *st = user;
    if (st->rc < 0)
        return 1;
    if (!name) /* a section header alone (inih with INI_CALL_HANDLER_ON_NEW_SECTION) */
        return 1;
    char v[CFG_MAX_LINE + 1];
    (void)ini_value(value ? value : "", v, sizeof v); /* a value fits: check_lines bounds the line */
    int rc = cfg_set(st->cfg, name, v);
    if (rc < 0) {
        st->rc = rc;
        snprintf(st->msg, sizeof st->msg, "%s", pf_errmsg());
        return 0;
    }
    return 1;
}

/* inih as Debian builds it keeps its line buffer on the stack, 200 bytes, and splits longer lines
 * silently; Debian's libinih exposes its compile-time switches as globals, so the parser is set once
 * to a growing heap buffer (a 255-character value fits on a line, as cfg_to_ini writes it), and
 * indented lines are read as ordinary `key = value` lines rather than continuations. */
#define CFG_MAX_FILE (4 << 20)
static pthread_once_t inih_once = PTHREAD_ONCE_INIT;

static void inih_setup(void)
{
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_initial_alloc = 512;
    ini_max_line = CFG_MAX_LINE + 3;
    ini_allow_multiline = false;
    /* inih would cut `output = "/tmp/a ;b"` at the ' ;' inside the quotes: inline comments are cut by
     * cfg_ini_handler (ini_value), which knows quotes. */
    ini_allow_inline_comments = false;
}

/* Refuses text whose lines the parser would split. Returns 0 or -EINVAL naming the line. */
static int check_lines(const char *text, const char *where)
{
    int line = 1;
    size_t len = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') {
            line++;
            len = 0;
        } else if (++len > CFG_MAX_LINE) {
            return pf_err(-EINVAL, "%s:%d: line longer than %d characters", where, line, CFG_MAX_LINE);
        }
    }
    return 0;
}

/* Applies the ini_parse* result `line` to the error message: "<where>:<line>: <problem>". */
static int finish_parse(parse_state *st, int line, const char *where)
{
    if (line == 0)
        return 0;
    if (line == -1)
        return pf_err(-ENOENT, "config file %s: cannot open: %s", where, strerror(errno));
    if (line == -2)
        return pf_err(-ENOMEM, "config %s: out of memory while parsing", where);
    if (st->rc < 0)
        return pf_err(st->rc, "%s:%d: %s", where, line, st->msg);
    return pf_err(-EINVAL, "%s:%d: syntax error (expected 'key = value' or '[section]')", where, line);
}

int cfg_load(pf_config *cfg, const char *path, const char *const *sets, int nset)
{
    return cfg_load_ex(cfg, path, sets, nset, 1);
}

int cfg_load_ex(pf_config *cfg, const char *path, const char *const *sets, int nset, int check_required)
{
    cfg_defaults(cfg);
    if (path) {
        uint8_t *bytes;
        size_t n;
        int rc = pf_read_file(path, CFG_MAX_FILE, &bytes, &n);
        if (rc == -EFBIG)
            return pf_err(rc, "config file %s: larger than 4 MiB", path);
        if (rc < 0)
            return pf_err_wrap(rc, "config file %s", path);
        char *text = (char *)bytes; /* NUL-terminated by pf_read_file */
        if (strlen(text) != n) {
            free(text);
            return pf_err(-EINVAL, "config file %s: contains a NUL byte (not a text file?)", path);
        }
        rc = check_lines(text, path);
        size_t pl = strlen(path);
        if (rc == 0 && pl > 3 && !strcmp(path + pl - 3, ".py")) {
            rc = cfg_load_py_text(cfg, text, path);
        } else if (rc == 0) {
            pthread_once(&inih_once, inih_setup);
            parse_state st = {cfg, 0, ""};
            rc = finish_parse(&st, ini_parse_string(text, cfg_ini_handler, &st), path);
        }
        free(text);
        if (rc < 0)
            return rc;
    }
    for (int i = 0; i < nset; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq)
            return pf_err(-EINVAL, "--set %s: expected key=value", sets[i]);
        char key[CFG_STR];
        size_t kl = (size_t)(eq - sets[i]);
        if (kl >= sizeof key)
            return pf_err(-EINVAL, "--set %s: key too long", sets[i]);
        memcpy(key, sets[i], kl);
        key[kl] = '\0';
        int rc = cfg_set(cfg, key, eq + 1);
        if (rc < 0)
            return pf_err_wrap(rc, "--set %s", sets[i]);
    }
    int rc = validate(cfg, check_required);
    if (rc < 0)
        return path ? pf_err_wrap(rc, "config %s", path) : rc;
    return 0;
}

int cfg_load_text(pf_config *cfg, const char *text)
{
    cfg_defaults(cfg);
    int rc = check_lines(text, "<config text>");
    if (rc < 0)
        return rc;
    pthread_once(&inih_once, inih_setup);
    parse_state st = {cfg, 0, ""};
    int line = ini_parse_string(text, cfg_ini_handler, &st);
    rc = finish_parse(&st, line, "<config text>");
    if (rc < 0)
        return rc;
    return validate(cfg, 1);
}

/* Shortest of %.15g/%.16g/%.17g that parses back to exactly `v` (0.1 prints as 0.1, as in Python). */
static void fmt_double(char *out, size_t cap, double v)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* Formats one key's value as text that cfg_set parses back to the same value. */
static void format_value(const pf_config *cfg, const key_def *k, char *out, size_t cap)
{
    const char *base = (const char *)cfg + k->off;
    switch (k->type) {
    case K_INT: snprintf(out, cap, "%d", *(const int *)(const void *)base); break;
    case K_I64: snprintf(out, cap, "%lld", (long long)*(const int64_t *)(const void *)base); break;
    case K_DOUBLE: fmt_double(out, cap, *(const double *)(const void *)base); break;
    case K_BOOL: snprintf(out, cap, "%s", *(const int *)(const void *)base ? "true" : "false"); break;
    case K_F3: {
        const double *v = (const double *)(const void *)base;
        char x[3][32];
        for (int i = 0; i < 3; i++)
            fmt_double(x[i], sizeof x[i], v[i]);
        snprintf(out, cap, "%s, %s, %s", x[0], x[1], x[2]);
        break;
    }
    case K_STR: {
        /* Quoted when blanks at the ends, a leading quote or ';', or a ' ;' would otherwise be lost on
         * parsing (str_quote; parse_str refused a value no quoting reads back). */
        int q = str_quote(base);
        if (q > 0)
            snprintf(out, cap, "%c%s%c", q, base, q);
        else
            snprintf(out, cap, "%s", base);
        break;
    }
    }
}

char *cfg_to_ini(const pf_config *cfg)
{
    size_t cap = 512 + (size_t)NKEYS * (CFG_STR + 80), len = 0;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    const char *section = "";
    len += (size_t)snprintf(text + len, cap - len,
                            "# pfcps effective run config (the shared secret is never written here)\n");
    for (int i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        if (strcmp(k->name, "secret") == 0)
            continue;
        if (strcmp(section, k->section) != 0) {
            section = k->section;
            len += (size_t)snprintf(text + len, cap - len, "%s[%s]\n", len > 0 ? "\n" : "", section);
        }
        char v[CFG_STR + 8];
        format_value(cfg, k, v, sizeof v);
        len += (size_t)snprintf(text + len, cap - len, "%s = %s\n", k->name, v);
    }
    return text;
}

void cfg_log(const pf_config *cfg)
{
    /* arcface_torch train.py: logging.info(": " + key + " " * (25 - len(key)) + str(value)). */
    for (int i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        char v[CFG_STR + 8];
        if (strcmp(k->name, "secret") == 0)
            snprintf(v, sizeof v, "%s", cfg->secret[0] ? "(set)" : "(from PFCPS_SECRET)");
        else
            format_value(cfg, k, v, sizeof v);
        int pad = 25 - (int)strlen(k->name);
        if (pad < 1)
            pad = 1;
        log_info(": %s%*s%s", k->name, pad, "", v);
    }
}

int cfg_format_key(const pf_config *cfg, const char *name, char *out, size_t cap)
{
    const key_def *k = find_key(name);
    if (!k)
        return pf_err(-EINVAL, "unknown key '%s'", name);
    format_value(cfg, k, out, cap);
    return 0;
}

int cfg_key_count(void)
{
    return NKEYS;
}

const char *cfg_key_name(int i)
{
    return i >= 0 && i < NKEYS ? keys[i].name : NULL;
}

const char *cfg_secret(const pf_config *cfg)
{
    if (cfg->secret[0])
        return cfg->secret;
    const char *env = getenv("PFCPS_SECRET");
    return env && *env ? env : NULL;
}

int cfg_replaces_workers(const pf_config *cfg, char *why, size_t n)
{
    const char *no = !cfg->replicas                     ? "replicas = 0"
                     : strcmp(cfg->device, "cuda") == 0 ? "device = cuda"
                                                        : NULL;
    if (why && n)
        snprintf(why, n, "%s", no ? no : "");
    return no == NULL;
}

const char *const cfg_member_local_keys[] = {"rendezvous",   "metrics_address", "join_timeout",
                                             "data_address", "apply_threads",   NULL};

const char *const cfg_data_plane_keys[] = {
    "servers", "num_classes", "embedding_size", "wire_dtype", "provider", "replicas", NULL};

const char *const cfg_worker_endpoint_keys[] = {"servers",  "num_classes", "embedding_size", "wire_dtype",
                                                "provider", "replicas",    "device",         "fp16",
                                                "bf16",     NULL};

int cfg_keys_text(const pf_config *cfg, const char *const *list, char *out, size_t cap)
{
    size_t o = 0;
    if (cap)
        out[0] = '\0';
    for (int i = 0; list[i]; i++) {
        char v[CFG_STR + 8];
        if (cfg_format_key(cfg, list[i], v, sizeof v) < 0)
            return -EINVAL;
        int n = snprintf(out + o, cap > o ? cap - o : 0, "%s = %s\n", list[i], v);
        if (n < 0 || o + (size_t)n >= cap)
            return pf_err(-ENOSPC, "the keys' text does not fit %zu bytes", cap);
        o += (size_t)n;
    }
    return (int)o;
}

int cfg_keys_text_diff(const char *text, const pf_config *cfg, char *out, size_t cap)
{
    size_t o = 0;
    int n = 0;
    if (cap)
        out[0] = '\0';
    const char *end = text + strnlen(text, 4096);
    for (const char *p = text; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *eq = NULL;
        for (const char *q = p; q + 3 <= le; q++)
            if (q[0] == ' ' && q[1] == '=' && q[2] == ' ') {
                eq = q;
                break;
            }
        char name[64], va[CFG_STR + 8], vb[CFG_STR + 8];
        if (eq && (size_t)(eq - p) < sizeof name && (size_t)(le - eq - 3) < sizeof va) {
            memcpy(name, p, (size_t)(eq - p));
            name[eq - p] = '\0';
            memcpy(va, eq + 3, (size_t)(le - eq - 3));
            va[le - eq - 3] = '\0';
            if (cfg_format_key(cfg, name, vb, sizeof vb) == 0 && strcmp(va, vb)) {
                if (o < cap)
                    o += (size_t)snprintf(out + o, cap - o, "%s%s = %s (%s)", n ? ", " : "", name, va, vb);
                n++;
            }
        }
        p = le + 1;
    }
    return n;
}

static int in_list(const char *name, const char *const *list)
{
    for (int i = 0; list && list[i]; i++)
        if (!strcmp(name, list[i]))
            return 1;
    return 0;
}

int cfg_diff(const pf_config *a, const pf_config *b, const pf_config *unset, const char *const *skip,
             char *out, size_t cap)
{
    size_t o = 0;
    int n = 0;
    if (cap)
        out[0] = '\0';
    for (int i = 0; i < NKEYS; i++) {
        const char *name = keys[i].name;
        char va[CFG_STR + 8], vb[CFG_STR + 8], vu[CFG_STR + 8];
        if (!strcmp(name, "secret") || in_list(name, skip) || cfg_format_key(a, name, va, sizeof va) < 0 ||
            cfg_format_key(b, name, vb, sizeof vb) < 0 || !strcmp(va, vb))
            continue;
        if (unset && cfg_format_key(unset, name, vu, sizeof vu) == 0 && !strcmp(va, vu))
            continue;
        if (o < cap)
            o += (size_t)snprintf(out + o, cap - o, "%s%s = %s (%s)", n ? ", " : "", name, va, vb);
        n++;
    }
    return n;
}
