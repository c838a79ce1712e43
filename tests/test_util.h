/* test_util.h - small helpers several tests share: whole-file read and write,
 * removing a scratch directory, running a `kvq` subcommand in-process with
 * its output captured, and, when the module's header is included first,
 * making a codec (kvq_codec.h) or reading an integer fixture tensor
 * (kvq_safetensors.h).
 *
 * Header-only and static inline, so a test pays only for what it calls.
 */
#ifndef KVQ_TEST_UTIL_H
#define KVQ_TEST_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

/* Reads the whole file at path. @return a malloc'd, NUL-terminated copy
 * (caller frees), with its length in *len when len is not NULL; NULL when the
 * file cannot be read (then *len is 0). */
static inline char *test_read_file(const char *path, size_t *len)
{
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* Writes len bytes of data to path (replacing it). @return 0, or -1 on any
 * open, write or close failure. */
/* Resident bytes of this process now (/proc/self/statm; 0 where unreadable). */
static inline size_t test_rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

static inline int test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Removes the plain files directly inside dir, then dir itself (scratch
 * directories of one level; best effort, errors ignored). */
static inline void test_rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            remove(p);
        }
    closedir(d);
    rmdir(dir);
}

/* Reads what the temporary file f holds into *out (malloc'd, NUL-terminated;
 * NULL when it cannot be read) when out is not NULL, then closes f. */
static inline void test_take_output_(FILE *f, char **out)
{
    if (out) {
        *out = NULL;
        long n = -1;
        if (fflush(f) == 0 && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
            *out = malloc((size_t)n + 1);
        if (*out) {
            if (fread(*out, 1, (size_t)n, f) == (size_t)n) {
                (*out)[n] = '\0';
            } else {
                free(*out);
                *out = NULL;
            }
        }
    }
    fclose(f);
}

/* Runs the subcommand cmd(argc, argv) in-process with stdout and stderr
 * redirected into temporary files. When out (err) is not NULL, *out (*err)
 * receives what was printed there: malloc'd, NUL-terminated, caller frees
 * (NULL if it could not be read back); a NULL out or err discards that stream.
 * @return cmd's exit status, or -1 when the temporary files cannot be made
 * (cmd not run). */
static inline int test_run_captured(int (*cmd)(int, char **), int argc, char **argv, char **out, char **err)
{
    if (out)
        *out = NULL;
    if (err)
        *err = NULL;
    fflush(stdout);
    fflush(stderr);
    FILE *fo = tmpfile(), *fe = tmpfile();
    if (!fo || !fe) {
        if (fo)
            fclose(fo);
        if (fe)
            fclose(fe);
        return -1;
    }
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = cmd(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    test_take_output_(fo, out);
    test_take_output_(fe, err);
    return rc;
}

/* test_run_captured into fixed buffers: out[out_cap] and err[err_cap] get
 * the streams NUL-terminated (truncated to cap - 1 bytes; empty if unreadable);
 * a NULL buffer discards that stream. @return as test_run_captured. */
static inline int test_run_captured_buf(int (*cmd)(int, char **), int argc, char **argv, char *out, size_t out_cap,
                                        char *err, size_t err_cap)
{
    char *o = NULL, *e = NULL;
    int rc = test_run_captured(cmd, argc, argv, out ? &o : NULL, err ? &e : NULL);
    if (out && out_cap)
        snprintf(out, out_cap, "%s", o ? o : "");
    if (err && err_cap)
        snprintf(err, err_cap, "%s", e ? e : "");
    free(o);
    free(e);
    return rc;
}

#ifdef KVQ_CODEC_H
/* A codec of type t for dimension d with the given seed and QJL kind (the
 * other fields at their defaults); a failure is a test failure.
 * @return the codec (caller frees), or NULL. */
static inline kvq_codec *test_codec_make(enum kvq_type t, int d, uint64_t seed, enum kvq_qjl_kind qjl)
{
    struct kvq_codec_config cfg;
    kvq_codec_config_default(&cfg, t, d);
    cfg.seed = seed;
    cfg.qjl = qjl;
    kvq_codec *c = NULL;
    kvq_status st = kvq_codec_create(&cfg, &c);
    CHECKF(st == KVQ_OK, "create %d at d=%d: %s", (int)t, d, kvq_status_str(st));
    return c;
}
#endif

#ifdef KVQ_SAFETENSORS_H
/* The integer tensor called key in f as int32 (token ids, positions).
 * @return a malloc'd array of *n values (caller frees), or NULL when there is
 * no such integer tensor (then *n is 0). */
static inline int32_t *test_st_ints(const kvq_st_file *f, const char *key, size_t *n)
{
    *n = 0;
    const struct kvq_st_tensor *t = kvq_st_find(f, key);
    if (!t)
        return NULL;
    int64_t *v = malloc(t->n_elements * sizeof *v + 1);
    int32_t *o = malloc(t->n_elements * sizeof *o + 1);
    if (!v || !o || kvq_st_to_i64(t, v, t->n_elements) != KVQ_OK) {
        free(v);
        free(o);
        return NULL;
    }
    for (size_t i = 0; i < t->n_elements; i++)
        o[i] = (int32_t)v[i];
    free(v);
    *n = t->n_elements;
    return o;
}
#endif

#endif /* KVQ_TEST_UTIL_H */
