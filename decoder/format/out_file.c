/* out_file.c - whole-or-nothing output files (see kvq_file.h). */
#include "kvq_file.h"

#include "format_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct kvq_out_file {
    FILE *fp;
    char *path; /* the target (a symbolic link resolved: the file it names is replaced) */
    char *tmp;  /* the temporary beside it; NULL when writing straight to a
                   target that is not a regular file (/dev/stdout, a pipe) */
};

/* "dir/.name.XXXXXX" for path "dir/name" (or ".name.XXXXXX"). */
static char *temp_template(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
    const char *base = path + dlen;
    size_t n = dlen + 1 + strlen(base) + 8;
    char *t = malloc(n);
    if (t)
        snprintf(t, n, "%.*s.%s.XXXXXX", (int)dlen, path, base);
    return t;
}

/* The directory part of path ("." when none), malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

/* Why a new file cannot be created beside path: the system's reason for
 * the directory when it is the culprit, for the file otherwise. */
static kvq_status create_error(const char *path, int e, kvq_error *err)
{
    char *dir = dir_of(path);
    struct stat sb;
    kvq_status st;
    if (dir && stat(dir, &sb) != 0)
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: cannot create: directory %s: %s", path, dir, strerror(errno));
    else if (dir && !S_ISDIR(sb.st_mode))
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: cannot create: %s is not a directory", path, dir);
    else
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    free(dir);
    return st;
}

mode_t kvq_umask_now(void)
{
    FILE *s = fopen("/proc/self/status", "r");
    char line[128];
    unsigned mask = 022;
    while (s && fgets(line, sizeof line, s))
        if (sscanf(line, "Umask: %o", &mask) == 1)
            break;
    if (s)
        fclose(s);
    return (mode_t)mask;
}

kvq_status kvq_out_file_create(const char *path, kvq_out_file **out, kvq_error *err)
{
    if (!path || !path[0] || !out)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_out_file_create: no path");
    *out = NULL;
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (exists && S_ISDIR(sb.st_mode))
        return kvq_error_set(err, KVQ_ERR_IO, "%s: is a directory", path);
    kvq_out_file *f = calloc(1, sizeof *f);
    if (!f)
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory", path);
    if (exists && !S_ISREG(sb.st_mode)) {
        /* A device or pipe is a stream, not a file to replace: renaming
         * over /dev/stdout or /dev/null would put a regular file there. */
        f->path = strdup(path);
        if (f->path && !(f->fp = fopen(path, "wb"))) {
            int e = errno;
            kvq_out_file_free(f);
            return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(e));
        }
        if (!f->path) {
            kvq_out_file_free(f);
            return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory", path);
        }
        *out = f;
        return KVQ_OK;
    }
    struct stat lsb;
    f->path = exists && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) ? realpath(path, NULL) : strdup(path);
    if (!f->path || !(f->tmp = temp_template(f->path))) {
        kvq_out_file_free(f);
        return kvq_error_set(err, KVQ_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = mkstemp(f->tmp);
    if (fd < 0) {
        int e = errno;
        free(f->tmp);
        f->tmp = NULL;
        kvq_out_file_free(f);
        return create_error(path, e, err);
    }
    /* mkstemp makes 0600; an output is an ordinary file (umask applied). */
    if (fchmod(fd, 0666 & ~kvq_umask_now()) != 0 || !(f->fp = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        kvq_out_file_free(f);
        return kvq_error_set(err, KVQ_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    *out = f;
    return KVQ_OK;
}

FILE *kvq_out_file_stream(kvq_out_file *f)
{
    return f ? f->fp : NULL;
}

const char *kvq_out_file_temp_path(const kvq_out_file *f)
{
    return f ? f->tmp : NULL;
}

void kvq_out_file_free(kvq_out_file *f)
{
    if (!f)
        return;
    if (f->fp)
        fclose(f->fp);
    if (f->tmp)
        unlink(f->tmp);
    free(f->tmp);
    free(f->path);
    free(f);
}

/* fsync of a directory, so that a rename in it survives a crash. */
static int sync_dir(const char *path)
{
    char *dir = dir_of(path);
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY) : -1;
    free(dir);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

kvq_status kvq_out_file_commit(kvq_out_file *f, kvq_error *err)
{
    if (!f)
        return kvq_error_set(err, KVQ_ERR_INVALID_ARG, "kvq_out_file_commit: NULL file");
    /* A write that failed earlier (full disk) left its bytes in the buffer:
     * this flush fails again and says why, where errno from then is gone. */
    errno = 0;
    int e = 0;
    if (fflush(f->fp) != 0 || ferror(f->fp))
        e = errno ? errno : EIO;
    else if (f->tmp && fsync(fileno(f->fp)) != 0)
        e = errno;
    if (fclose(f->fp) != 0 && !e)
        e = errno;
    f->fp = NULL;
    if (!e && f->tmp && rename(f->tmp, f->path) != 0)
        e = errno;
    kvq_status st = KVQ_OK;
    if (e)
        st = kvq_error_set(err, KVQ_ERR_IO, "%s: write failed: %s", f->path, strerror(e));
    else if (f->tmp) {
        free(f->tmp); /* renamed: nothing to remove */
        f->tmp = NULL;
        sync_dir(f->path); /* best effort: some file systems refuse a directory fsync */
    }
    kvq_out_file_free(f);
    return st;
}

kvq_status kvq_out_path_check(const char *path, kvq_error *err)
{
    struct stat sb;
    if (path && stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
        return access(path, W_OK) == 0 ? KVQ_OK /* a device or pipe: opening it may block or consume */
                                       : kvq_error_set(err, KVQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    kvq_out_file *f;
    kvq_status st = kvq_out_file_create(path, &f, err);
    kvq_out_file_free(f);
    return st;
}

kvq_status kvq_write_file_atomic(const char *path, const void *data, size_t len, kvq_error *err)
{
    kvq_out_file *f;
    kvq_status st = kvq_out_file_create(path, &f, err);
    if (st != KVQ_OK)
        return st;
    if (len && fwrite(data, 1, len, f->fp) != len) {
        int e = errno;
        kvq_out_file_free(f);
        return kvq_error_set(err, KVQ_ERR_IO, "%s: write failed: %s", path, strerror(e ? e : EIO));
    }
    return kvq_out_file_commit(f, err);
}
