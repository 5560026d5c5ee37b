/* The command-line reader every pfcps subcommand uses (tools/cmd_*.c): a table of the command's options,
 * read one argument at a time, and the usage errors worded the same way in every command.
 *
 *   static const tool_opt opts[] = {{"--flip", 0}, {"--batch", 1}, {NULL, 0}};
 *   tool_args a;
 *   tool_args_init(&a, "embed", opts, argc, argv);
 *   for (int k; (k = tool_args_next(&a)) != TOOL_END;)
 *       switch (k) { case 0: ...; case 1: if (tool_opt_int(&a, 1, 1024, NULL, &batch) < 0) return 2; ... }
 *
 * Rules, the same for every command: an option is an argument that starts with '-' and is longer than "-";
 * an option that takes a value takes the next argument, whatever it looks like (`--link-gbps -3`), or the
 * text after '=' in `--name=value` (which an option without a value refuses as unknown); "-" and
 * every argument after "--" are positional; options and positional arguments may come in any order. */
#ifndef PFCPS_TOOLS_OPTS_H
#define PFCPS_TOOLS_OPTS_H

#include <stdint.h>

/* One option of a command: its name as typed ("--batch") and whether the next argument is its value. */
typedef struct tool_opt {
    const char *name;
    int has_value;
} tool_opt;

/* The reader's state over argv[1..argc-1] (argv[0] is the command's name). */
typedef struct tool_args {
    const char *cmd;      /* "pack": messages read "pfcps pack: ..." */
    const tool_opt *opts; /* the command's options, ended by {NULL, 0} */
    int argc;
    char **argv;
    int i;           /* the next argument to read */
    int only_pos;    /* "--" seen: the rest is positional */
    const char *opt; /* the option (or the unknown one) just read */
    char name[64];   /* the option's name of a --name=value argument (opt points here then) */
    const char *arg; /* its value (NULL when it takes one and none is left), or the positional argument */
} tool_args;

enum {
    TOOL_END = -1,        /* no arguments left */
    TOOL_POSITIONAL = -2, /* a->arg is a positional argument */
    TOOL_UNKNOWN = -3,    /* a->opt starts with '-' and is none of the command's options */
};

void tool_args_init(tool_args *a, const char *cmd, const tool_opt *opts, int argc, char **argv);

/* Reads the next argument: returns the index of the option in a->opts (a->opt its name, a->arg its value
 * when it takes one: NULL when argv ends first), TOOL_POSITIONAL (a->arg), TOOL_UNKNOWN (a->opt) or TOOL_END.
 */
int tool_args_next(tool_args *a);

/* Prints "pfcps CMD: OPTION needs WANT, got 'VALUE'" (or "got nothing" when the value is missing) to stderr
 * for the option just read. Returns -1. */
int tool_opt_bad(const tool_args *a, const char *want);

/* The value of the option just read as a base-10 integer in [lo, hi] into *v. Returns 0, or -1 after
 * printing "pfcps CMD: OPTION needs WANT, got ..." (tool_opt_bad); want NULL means "an integer in [lo, hi]".
 */
int tool_opt_i64(const tool_args *a, int64_t lo, int64_t hi, const char *want, int64_t *v);
int tool_opt_int(const tool_args *a, int lo, int hi, const char *want, int *v);

/* Prints "pfcps CMD: unexpected argument 'ARG'" to stderr, followed by `usage` on its own line when it is
 * not NULL. Returns 2 (the exit status of a usage error). */
int tool_unexpected(const tool_args *a, const char *arg, const char *usage);

#endif
