/* cli.h - what the kvq subcommands share: the command table and argument helpers.
 *
 * Each subcommand lives in tools/cmd_NAME.c as `int cmd_NAME(int argc, char **argv)`
 * (argv[0] is the subcommand name) and returns the process exit status:
 * 0 success, 1 failure of the work itself, 2 bad usage or bad input.
 * Errors are one line on stderr: "kvq NAME: error: ...".
 */
#ifndef KVQ_CLI_H
#define KVQ_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_status.h"

struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

/* Prints "kvq CMD: error: MESSAGE" to stderr. @return 2 (usage/input error). */
int cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Same, with the kvq_status text appended. @return 1 for work failures,
 * 2 for bad input (invalid argument, unsupported, non-finite, format). */
int cli_status_error(const char *cmd, kvq_status st, const char *what);

/* Strict parsers: the whole string must be consumed. @return 0 or -1. */
int cli_parse_int(const char *s, long min, long max, long *out);
int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_double(const char *s, double *out);
/* Sizes like "4096", "48MiB", "2GiB", "512KB" (KB/MB/GB are powers of 1000). */
int cli_parse_size(const char *s, size_t *out);

/* True when argv[i] is "--help" or "-h". */
int cli_is_help(const char *arg);

/* Reads a whole file into a NUL-terminated malloc'ed buffer (free() it);
 * *len excludes the NUL. @return NULL when it cannot be opened or read. */
char *cli_read_file(const char *path, size_t *len);

/* Monotonic wall clock in seconds. */
double cli_now(void);

#endif
