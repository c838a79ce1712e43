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
/* The same with the library's own account of the failure (e.g.
 * kvq_seq_error_detail) in place of the status's name, when why != NULL. */
int cli_status_error_why(const char *cmd, kvq_status st, const char *what, const char *why);

/* Strict parsers: the whole string must be consumed. @return 0 or -1. */
int cli_parse_int(const char *s, long min, long max, long *out);
int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_double(const char *s, double *out);
/* Sizes like "4096", "48MiB", "2GiB", "512KB" (KB/MB/GB are powers of 1000). */
int cli_parse_size(const char *s, size_t *out);

/* True when argv[i] is "--help" or "-h". */
int cli_is_help(const char *arg);

/* Rewrites a subcommand's argv (argv[0] = its name) into the spelling the
 * subcommands parse, so every command takes the habits people bring from
 * llama.cpp and GNU tools: "--opt=value" becomes "--opt" "value"; the short
 * aliases -m -p -f -n -c -t -s -ctk -ctv and the long --ctx-size,
 * --n-predict, --threads spellings become their kvq names (-f is
 * --prompt-file for run, --file for ppl). A token that is the value of the
 * option before it is never rewritten, so "-p -n" is the prompt "-n"; to know
 * that, options without a value are listed in cli.c (cli_value_less).
 * argv's strings must be writable ("--opt=value" is cut at the '=').
 * @return the new argv (malloc'ed, free() it; the strings are argv's or
 * static), or NULL when out of memory. */
char **cli_normalize_args(int argc, char **argv, int *new_argc);

/* True for an option that takes no value (--json, --quiet, --plan, ...). */
int cli_value_less(const char *arg);

/* After a command ran: flushes and closes stdout and turns a write error
 * (a full disk, a closed pipe) into "kvq CMD: error: writing to standard
 * output: REASON" and exit status 1 (2, bad input, stays 2).
 * @return the status the process should end with. */
int cli_finish_stdout(const char *cmd, int rc);

/* fflush(stdout) that remembers why it failed, for cli_finish_stdout (errno
 * does not survive until the end). @return 0 or EOF. */
int cli_flush_stdout(void);

/* Byte offset of the first invalid UTF-8 sequence in s[0..len), or -1 when
 * all of it is valid (overlong forms, surrogates and values above U+10FFFF
 * are invalid). */
long cli_utf8_invalid_at(const char *s, size_t len);

/* s in lower case, in buf (cap bytes; longer names are cut, so they stay
 * unknown): cache-type names are matched in any case ("TQ3J", "Q8_0"). */
const char *cli_lower(const char *s, char *buf, size_t cap);

/* Sizes accepted by cli_parse_size, for --help texts. */
#define CLI_SIZE_HELP "sizes: 4096 (bytes), 512KiB, 48MiB, 2GiB (powers of 1024; K/M/G alone too)\n" \
                      "or 512kB, 48MB, 2GB (powers of 1000), any case"

/* Reads a whole file into a NUL-terminated malloc'ed buffer (free() it);
 * *len excludes the NUL; "-" reads standard input. @return NULL when it
 * cannot be opened or read (errno says why). */
char *cli_read_file(const char *path, size_t *len);

/* cli_read_file for text the tokenizer will read: on failure prints
 * "kvq CMD: error: PATH: cannot read WHAT: REASON" or, for bytes that are
 * not UTF-8, the byte offset of the first bad sequence.
 * @return the text (free() it), or NULL after printing (exit status 2). */
char *cli_read_text(const char *cmd, const char *path, const char *what, size_t *len);

/* Monotonic wall clock in seconds. */
double cli_now(void);

#endif
