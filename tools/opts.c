/* The subcommands' command-line reader (see opts.h). */
#include "tools/opts.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tool_args_init(tool_args *a, const char *cmd, const tool_opt *opts, int argc, char **argv)
{
    *a = (tool_args){.cmd = cmd, .opts = opts, .argc = argc, .argv = argv, .i = 1};
}

int tool_args_next(tool_args *a)
{
    a->opt = a->arg = NULL;
    if (a->i >= a->argc)
        return TOOL_END;
    const char *s = a->argv[a->i++];
    if (!a->only_pos && strcmp(s, "--") == 0) {
        a->only_pos = 1;
        return tool_args_next(a);
    }
    if (a->only_pos || s[0] != '-' || !s[1]) {
        a->arg = s;
        return TOOL_POSITIONAL;
    }
    a->opt = s;
    /* --name=value: the option's value follows the '=' (options that take one only) */
    const char *eq = s[1] == '-' ? strchr(s, '=') : NULL;
    if (eq && (size_t)(eq - s) < sizeof a->name) {
        memcpy(a->name, s, (size_t)(eq - s));
        a->name[eq - s] = 0;
        for (int k = 0; a->opts[k].name; k++) {
            if (strcmp(a->name, a->opts[k].name) != 0 || !a->opts[k].has_value)
                continue;
            a->opt = a->name;
            a->arg = eq + 1;
            return k;
        }
        return TOOL_UNKNOWN;
    }
    for (int k = 0; a->opts[k].name; k++) {
        if (strcmp(s, a->opts[k].name) != 0)
            continue;
        if (a->opts[k].has_value && a->i < a->argc)
            a->arg = a->argv[a->i++];
        return k;
    }
    return TOOL_UNKNOWN;
}

int tool_opt_bad(const tool_args *a, const char *want)
{
    if (a->arg)
        fprintf(stderr, "pfcps %s: %s needs %s, got '%s'\n", a->cmd, a->opt, want, a->arg);
    else
        fprintf(stderr, "pfcps %s: %s needs %s, got nothing\n", a->cmd, a->opt, want);
    return -1;
}

int tool_opt_i64(const tool_args *a, int64_t lo, int64_t hi, const char *want, int64_t *v)
{
    char *end = NULL;
    long long x = 0;
    if (a->arg) {
        errno = 0;
        x = strtoll(a->arg, &end, 10);
    }
    if (!a->arg || errno || end == a->arg || *end || x < lo || x > hi) {
        char range[96];
        snprintf(range, sizeof range, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
        return tool_opt_bad(a, want ? want : range);
    }
    *v = (int64_t)x;
    return 0;
}

int tool_opt_int(const tool_args *a, int lo, int hi, const char *want, int *v)
{
    int64_t x;
    if (tool_opt_i64(a, lo, hi, want, &x) < 0)
        return -1;
    *v = (int)x;
    return 0;
}

int tool_unexpected(const tool_args *a, const char *arg, const char *usage)
{
    fprintf(stderr, "pfcps %s: unexpected argument '%s'\n", a->cmd, arg);
    if (usage)
        fprintf(stderr, "%s\n", usage);
    return 2;
}
