/* cli.c - argument parsing and error printing shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvq %s: error: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int cli_status_error(const char *cmd, kvq_status st, const char *what)
{
    return cli_status_error_why(cmd, st, what, NULL);
}

int cli_status_error_why(const char *cmd, kvq_status st, const char *what, const char *why)
{
    fprintf(stderr, "kvq %s: error: %s: %s\n", cmd, what, why ? why : kvq_status_str(st));
    switch (st) {
    case KVQ_ERR_INVALID_ARG:
    case KVQ_ERR_UNSUPPORTED:
    case KVQ_ERR_NONFINITE:
    case KVQ_ERR_RANGE:
    case KVQ_ERR_FORMAT:
    case KVQ_ERR_IO:
        return 2;
    default:
        return 1;
    }
}

int cli_parse_int(const char *s, long min, long max, long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, size_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -1;
    static const struct { const char *suffix; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3}, {"M", 1048576.0},
        {"MiB", 1048576.0}, {"MB", 1e6}, {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0 && (units[i].suffix[0] || !*end)) {
            double bytes = v * units[i].mul;
            if (bytes > 9.0e18)
                return -1;
            *out = (size_t)bytes;
            return 0;
        }
    }
    return -1;
}

const char *cli_lower(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        buf[i] = (char)((s[i] >= 'A' && s[i] <= 'Z') ? s[i] - 'A' + 'a' : s[i]);
    buf[i] = 0;
    return buf;
}

int cli_is_help(const char *arg)
{
    return arg && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0);
}

char *cli_read_text(const char *cmd, const char *path, const char *what, size_t *len)
{
    errno = 0;
    char *text = cli_read_file(path, len);
    if (!text) {
        cli_error(cmd, "%s: cannot read %s: %s", strcmp(path, "-") ? path : "standard input", what,
                  strerror(errno ? errno : EIO));
        return NULL;
    }
    long bad = cli_utf8_invalid_at(text, *len);
    if (bad >= 0) {
        cli_error(cmd, "%s: not valid UTF-8 at byte %ld (0x%02x)", strcmp(path, "-") ? path : "standard input", bad,
                  (unsigned char)text[bad]);
        free(text);
        return NULL;
    }
    return text;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *cli_read_file(const char *path, size_t *len)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap *= 2) : NULL;
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    if (buf && ferror(f)) {
        int e = errno;
        free(buf);
        buf = NULL;
        errno = e;
    } else if (!buf)
        errno = ENOMEM;
    if (!is_stdin)
        fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = n;
    }
    return buf;
}

/* Options that take no value, over all subcommands: the token after any
 * other option is its value and is left alone. */
static const char *const value_less[] = {
    "--help", "-h", "--json", "--quiet", "--plan", "--force", "--no-eos", "--v-norm-correct", "--kv-recent-f16",
    "--no-kv-recent-f16", "--kv-auto", "--sweep", "--per-layer", "--synthetic", "--compute", "--emit-c",
    "--mse-table", "--version", "--no-bos", "--skip-special", "--kl-divergence", "--no-key-outlier-f16",
    "--no-cuda-graphs", "--fast-prefill", "--exact-prefill", "--kv-center-k", "--no-kv-center-k",
};

int cli_value_less(const char *arg)
{
    for (size_t i = 0; i < sizeof value_less / sizeof value_less[0]; i++)
        if (strcmp(arg, value_less[i]) == 0)
            return 1;
    return 0;
}

static const struct {
    const char *alias, *name, *only; /* only: the one command it applies to, or NULL */
} aliases[] = {
    {"-m", "--model", NULL},          {"-p", "--prompt", NULL},         {"-f", "--prompt-file", "run"},
    {"-f", "--file", "ppl"},          {"--file", "--prompt-file", "run"}, {"-n", "--max-tokens", NULL},
    {"--n-predict", "--max-tokens", NULL}, {"-c", "--ctx", NULL},        {"--ctx-size", "--ctx", NULL},
    {"-t", "--threads", NULL},        {"-s", "--seed", NULL},           {"-ctk", "--cache-type-k", NULL},
    {"-ctv", "--cache-type-v", NULL},
};

static const char *alias_of(const char *cmd, const char *a)
{
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(a, aliases[i].alias) == 0 && (!aliases[i].only || strcmp(cmd, aliases[i].only) == 0))
            return aliases[i].name;
    return a;
}

char **cli_normalize_args(int argc, char **argv, int *new_argc)
{
    /* "--a=v" splits in two: at most twice as many tokens. */
    char **out = calloc(2 * (size_t)argc + 1, sizeof *out);
    if (!out)
        return NULL;
    int n = 0, value_next = 0;
    out[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (value_next || a[0] != '-' || strcmp(a, "-") == 0) {
            out[n++] = a; /* a value or a positional argument, as given */
            value_next = 0;
            continue;
        }
        if (strcmp(a, "--") == 0) { /* the rest is positional */
            while (++i < argc)
                out[n++] = argv[i];
            break;
        }
        char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        if (eq) {
            *eq = 0; /* argv's strings are the program's to modify */
            out[n++] = (char *)alias_of(argv[0], a);
            out[n++] = eq + 1;
            continue;
        }
        out[n++] = (char *)alias_of(argv[0], a);
        value_next = !cli_value_less(out[n - 1]);
    }
    out[n] = NULL;
    *new_argc = n;
    return out;
}

static int stdout_errno; /* reason of the first failed cli_flush_stdout */

int cli_flush_stdout(void)
{
    errno = 0;
    int rc = fflush(stdout);
    if (rc != 0 && !stdout_errno)
        stdout_errno = errno;
    return rc;
}

int cli_finish_stdout(const char *cmd, int rc)
{
    /* A write error may have happened long before (streamed text): the
     * stream's error flag keeps it, errno of the last failed write says why. */
    errno = 0;
    int bad = fflush(stdout) != 0;
    int e = errno;
    bad |= ferror(stdout) != 0;
    if (fclose(stdout) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad)
        return rc;
    if (!e)
        e = stdout_errno;
    fprintf(stderr, "kvq %s: error: writing to standard output: %s\n", cmd, e ? strerror(e) : "write error");
    /* The work's output is lost: a failure (1), also where the command
     * would have said 3 (kvq run stopped early); bad input keeps its 2. */
    return rc == 2 ? 2 : 1;
}

long cli_utf8_invalid_at(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF)
            n = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, cp = c & 0x07, min = 0x10000;
        else
            return (long)i;
        if (len - i <= n)
            return (long)i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return (long)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return (long)i;
        i += n + 1;
    }
    return -1;
}
