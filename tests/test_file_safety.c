/* test_file_safety.c - outputs appear whole or not at all (kvq_file.h), kvq
 * shard's directory survives concurrent and killed writers, and the index of
 * a sharded Hugging Face checkpoint is held against its files.
 *
 * The writer tests fork: two writers race for one --out, or a writer is
 * killed (SIGKILL) at points spread over its run; afterwards the directory
 * must hold one complete output (every shard's checksum as runtime_meta.json
 * declares, nothing else) or, when none finished, be as it was.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvq_file.h"
#include "kvq_manifest.h"
#include "test.h"

static char tmp[64]; /* scratch directory of this run */

/* Removes dir and the files in it (the outputs here hold no subdirectory). */
static void rm_flat(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
            remove(p);
    if (d)
        closedir(d);
    rmdir(dir);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf)
        buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    if (d)
        closedir(d);
    return n;
}

/* Removes what killed writers left in tmp: ".NAME.kvq-tmp-*" directories. */
static int remove_leftovers(void)
{
    DIR *d = opendir(tmp);
    struct dirent *e;
    char p[1024];
    int n = 0;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".kvq-tmp-")) {
            snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
            rm_flat(p);
            n++;
        }
    if (d)
        closedir(d);
    return n;
}

/* Number of layer shards of the complete output in dir, 0 when dir is
 * absent, -1 when it is there but not one complete output (a shard missing,
 * corrupt or extra, the manifest unreadable). */
static int output_layout(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, KVQ_MANIFEST_FILE);
    size_t len;
    char *text = slurp(path, &len);
    if (!text)
        return -1;
    struct kvq_manifest m;
    kvq_error err = {0};
    int layers = -1;
    if (kvq_manifest_parse(text, len, &m, &err) == KVQ_OK) {
        if (kvq_manifest_validate(&m, NULL, &err) == KVQ_OK && kvq_manifest_check_files(&m, dir, 1, &err) == KVQ_OK &&
            count_entries(dir, "") == (int)m.n_shards + 3) { /* + config.json, tokenizer.json, the manifest */
            layers = 0;
            for (size_t i = 0; i < m.n_shards; i++)
                layers += m.shards[i].kind == KVQ_SHARD_LAYERS;
        }
        kvq_manifest_clear(&m);
    }
    free(text);
    return layers;
}

/* The bundled model has 4 layers of ~4.7 MB: 256 MiB shards give 1 layer
 * shard, 1 MiB shards 4, so the two layouts tell the writers apart. */
static const struct kvq_shard_opts one_shard = {.max_shard_mb = 0, .lm_head_shards = 1};
static const struct kvq_shard_opts four_shards = {.max_shard_mb = 1, .lm_head_shards = 2};

static void test_out_file(void)
{
    char path[256], link[256];
    kvq_error err = {0};
    snprintf(path, sizeof path, "%s/out.txt", tmp);
    CHECK_OK(kvq_write_file_atomic(path, "old\n", 4, &err));
    /* an abandoned write leaves the old file and no temporary */
    kvq_out_file *f;
    CHECK_OK(kvq_out_file_create(path, &f, &err));
    fputs("half", kvq_out_file_stream(f));
    CHECK(count_entries(tmp, ".out.txt.") == 1);
    kvq_out_file_free(f);
    char *got = slurp(path, NULL);
    CHECK(got && strcmp(got, "old\n") == 0);
    free(got);
    CHECK(count_entries(tmp, ".out.txt.") == 0);
    /* a committed one replaces it, as an ordinary file (umask applied) */
    mode_t old_mask = umask(022);
    CHECK_OK(kvq_out_file_create(path, &f, &err));
    fputs("new\n", kvq_out_file_stream(f));
    CHECK_OK(kvq_out_file_commit(f, &err));
    umask(old_mask);
    got = slurp(path, NULL);
    CHECK(got && strcmp(got, "new\n") == 0);
    free(got);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0644);
    CHECK(count_entries(tmp, ".out.txt.") == 0);
    /* through a symbolic link the file it names is replaced, the link stays */
    snprintf(link, sizeof link, "%s/link.txt", tmp);
    CHECK(symlink("out.txt", link) == 0);
    CHECK_OK(kvq_write_file_atomic(link, "via link\n", 9, &err));
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    got = slurp(path, NULL);
    CHECK(got && strcmp(got, "via link\n") == 0);
    free(got);
    unlink(link);
    unlink(path);
}

static void test_out_file_errors(void)
{
    kvq_error err = {0};
    char path[256];
    snprintf(path, sizeof path, "%s/no-such-dir/x.json", tmp);
    CHECK_STATUS(kvq_out_path_check(path, &err), KVQ_ERR_IO);
    CHECKF(strstr(err.msg, "No such file or directory") && strstr(err.msg, "no-such-dir"), "%s", err.msg);
    CHECK_STATUS(kvq_out_path_check(tmp, &err), KVQ_ERR_IO);
    CHECKF(strstr(err.msg, "is a directory"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/ok.json", tmp);
    CHECK_OK(kvq_out_path_check(path, &err));
    CHECK(count_entries(tmp, "") == 0); /* the check leaves nothing behind */
    /* a full disk: the error names the reason, and a device stays a device
     * (never renamed over) */
    struct stat sb;
    if (stat("/dev/full", &sb) != 0 || !S_ISCHR(sb.st_mode))
        SKIP("no /dev/full");
    CHECK_OK(kvq_out_path_check("/dev/full", &err));
    CHECK_STATUS(kvq_write_file_atomic("/dev/full", "x", 1, &err), KVQ_ERR_IO);
    CHECKF(strstr(err.msg, "No space left on device"), "%s", err.msg);
    CHECK(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode));
}

static void test_shard_out_rules(void)
{
    char out[256], stale[300], sub[300];
    kvq_error err = {0};
    snprintf(out, sizeof out, "%s/rules", tmp);
    CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &four_shards, &err));
    CHECK(output_layout(out) == 4);
    /* not empty: refused without --force, untouched */
    CHECK_STATUS(kvq_shard_write(TEST_MODEL_DIR, out, &one_shard, &err), KVQ_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "not empty") && strstr(err.msg, "--force"), "%s", err.msg);
    CHECK(output_layout(out) == 4);
    /* --force replaces everything: no stale shard of the old layout stays */
    snprintf(stale, sizeof stale, "%s/layers-009-009.safetensors", out);
    FILE *f = fopen(stale, "w");
    CHECK(f && fclose(f) == 0);
    struct kvq_shard_opts force = one_shard;
    force.force = 1;
    CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &force, &err));
    CHECK(output_layout(out) == 1);
    CHECK(access(stale, F_OK) != 0);
    /* --force replaces only a directory of files */
    snprintf(sub, sizeof sub, "%s/keep", out);
    CHECK(mkdir(sub, 0755) == 0);
    CHECK_STATUS(kvq_shard_write(TEST_MODEL_DIR, out, &force, &err), KVQ_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "subdirectory 'keep'"), "%s", err.msg);
    rmdir(sub);
    /* never the source, by any spelling */
    CHECK_STATUS(kvq_shard_write(TEST_MODEL_DIR, TEST_MODEL_DIR "/", &force, &err), KVQ_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "source model directory"), "%s", err.msg);
    /* a file is not a directory */
    snprintf(stale, sizeof stale, "%s/config.json", out);
    CHECK_STATUS(kvq_shard_write(TEST_MODEL_DIR, stale, &force, &err), KVQ_ERR_INVALID_ARG);
    CHECK(remove_leftovers() == 0);
    rm_flat(out);
}

/* Runs kvq_shard_write in a child. @return its pid. */
static pid_t spawn_writer(const char *out, const struct kvq_shard_opts *o)
{
    pid_t pid = fork();
    if (pid == 0) {
        kvq_error err = {0};
        kvq_status st = kvq_shard_write(TEST_MODEL_DIR, out, o, &err);
        if (st != KVQ_OK && st != KVQ_ERR_IO && st != KVQ_ERR_INVALID_ARG)
            fprintf(stderr, "  writer: %s\n", err.msg);
        _exit(st == KVQ_OK ? 0 : st == KVQ_ERR_IO || st == KVQ_ERR_INVALID_ARG ? 1 : 2);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int ws;
    if (waitpid(pid, &ws, 0) != pid)
        return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 100 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

static void test_two_writers(void)
{
    char out[256];
    snprintf(out, sizeof out, "%s/race", tmp);
    for (int round = 0; round < 4; round++) {
        /* without --force into an absent --out: exactly one wins, the other
         * says so, and the output is the winner's, complete */
        pid_t a = spawn_writer(out, &one_shard), b = spawn_writer(out, &four_shards);
        int ra = wait_exit(a), rb = wait_exit(b);
        CHECKF((ra == 0) + (rb == 0) == 1 && ra != 2 && rb != 2 && ra < 100 && rb < 100, "round %d: exits %d, %d",
               round, ra, rb);
        int layout = output_layout(out);
        CHECKF(layout == (ra == 0 ? 1 : 4), "round %d: layout %d, winner %c", round, layout, ra == 0 ? 'a' : 'b');
        /* with --force over it: both succeed, one complete output remains */
        struct kvq_shard_opts fa = one_shard, fb = four_shards;
        fa.force = fb.force = 1;
        a = spawn_writer(out, &fa);
        b = spawn_writer(out, &fb);
        ra = wait_exit(a);
        rb = wait_exit(b);
        CHECKF(ra == 0 && rb == 0, "round %d (--force): exits %d, %d", round, ra, rb);
        layout = output_layout(out);
        CHECKF(layout == 1 || layout == 4, "round %d (--force): layout %d", round, layout);
        CHECK(remove_leftovers() == 0);
        rm_flat(out);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    struct timespec d = {(time_t)s, (long)(1e9 * (s - (double)(time_t)s))};
    nanosleep(&d, NULL);
}

static void test_killed_writer(void)
{
    char out[256];
    kvq_error err = {0};
    snprintf(out, sizeof out, "%s/killed", tmp);
    struct kvq_shard_opts force = four_shards, back = one_shard;
    force.force = back.force = 1;
    CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &one_shard, &err));
    double t0 = now(); /* how long the writer that gets killed runs */
    CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &force, &err));
    double dur = now() - t0;
    CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &back, &err));
    int seen_old = 0, seen_new = 0;
    for (int k = 0; k < 10; k++) {
        /* over an existing output: the old one or the new one, whole */
        pid_t pid = spawn_writer(out, &force);
        sleep_s(dur * 1.5 * k / 10);
        kill(pid, SIGKILL);
        int rc = wait_exit(pid);
        CHECKF(rc == 0 || rc == 100 + SIGKILL, "kill %d: writer exit %d", k, rc);
        int layout = output_layout(out);
        CHECKF(layout == 1 || layout == 4, "kill %d at %.0f ms: layout %d", k, 1e3 * dur * 1.5 * k / 10, layout);
        seen_old += layout == 1;
        seen_new += layout == 4;
        remove_leftovers();
        if (layout == 4) /* back to the old output for the next kill */
            CHECK_OK(kvq_shard_write(TEST_MODEL_DIR, out, &back, &err));
    }
    printf("  killed writer: %d times the old output, %d times the new one (run %.0f ms)\n", seen_old, seen_new,
           1e3 * dur);
    CHECK(seen_old > 0); /* a kill at 0 ms always lands before the swap */
    /* into an absent --out: nothing, or the complete output */
    rm_flat(out);
    for (int k = 0; k < 5; k++) {
        pid_t pid = spawn_writer(out, &four_shards);
        sleep_s(dur * 1.3 * k / 5);
        kill(pid, SIGKILL);
        wait_exit(pid);
        int layout = output_layout(out);
        CHECKF(layout == 0 || layout == 4, "kill %d into an absent --out: layout %d", k, layout);
        remove_leftovers();
        rm_flat(out);
    }
}

/* A directory holding the bundled model's weight files (linked) and the
 * index text given. */
static void make_index_dir(const char *dir, const char *index)
{
    static const char *const files[] = {"config.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char src[512], dst[512], cwd[256];
    mkdir(dir, 0755);
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s/%s", cwd, TEST_MODEL_DIR, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        unlink(dst);
        CHECK(symlink(src, dst) == 0);
    }
    snprintf(dst, sizeof dst, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(dst, "w");
    CHECK(f && fputs(index, f) >= 0 && fclose(f) == 0);
}

/* kvq_shard_measure opens the checkpoint through its index. */
static kvq_status open_index(const char *dir, kvq_error *err)
{
    struct kvq_model_config cfg;
    size_t bytes[64];
    return kvq_shard_measure(dir, &cfg, bytes, 64, err);
}

static void test_index_weight_map(void)
{
    size_t len;
    char *orig = slurp(TEST_MODEL_DIR "/model.safetensors.index.json", &len);
    CHECK(orig != NULL);
    cJSON *root = cJSON_Parse(orig);
    cJSON *map = cJSON_GetObjectItem(root, "weight_map");
    CHECK(cJSON_IsObject(map) && cJSON_GetArraySize(map) > 4);
    if (!cJSON_IsObject(map)) {
        free(orig);
        cJSON_Delete(root);
        return;
    }
    const char *f1 = "model-00001-of-00002.safetensors", *f2 = "model-00002-of-00002.safetensors";
    char dir[256];
    snprintf(dir, sizeof dir, "%s/index", tmp);
    kvq_error err = {0};
    make_index_dir(dir, orig);
    CHECK_OK(open_index(dir, &err));
    /* a tensor of the first file, its name */
    const cJSON *e = map->child;
    while (e && strcmp(e->valuestring, f1) != 0)
        e = e->next;
    CHECK(e != NULL);
    if (!e)
        return;
    char name[256];
    snprintf(name, sizeof name, "%s", e->string);
    static const struct {
        const char *what, *expect;
    } cases[] = {
        {"omitted", "which weight_map does not list"},
        {"wrong shard", "which weight_map puts in"},
        {"extra", "which does not hold it"},
    };
    for (int c = 0; c < 3; c++) {
        cJSON *r = cJSON_Duplicate(root, 1);
        cJSON *m = cJSON_GetObjectItem(r, "weight_map");
        if (c == 0)
            cJSON_DeleteItemFromObjectCaseSensitive(m, name);
        else if (c == 1)
            cJSON_ReplaceItemInObjectCaseSensitive(m, name, cJSON_CreateString(f2));
        else
            cJSON_AddStringToObject(m, "model.layers.0.extra.weight", f1);
        char *text = cJSON_Print(r);
        make_index_dir(dir, text);
        CHECK_STATUS(open_index(dir, &err), KVQ_ERR_FORMAT);
        CHECKF(strstr(err.msg, cases[c].expect) && strstr(err.msg, "model.safetensors.index.json"), "%s: %s",
               cases[c].what, err.msg);
        cJSON_free(text);
        cJSON_Delete(r);
    }
    /* a tensor listed twice (JSON with a repeated key) */
    char *dup = malloc(len + 512);
    char *brace = strstr(orig, "\"weight_map\"");
    brace = brace ? strchr(brace, '{') : NULL;
    CHECK(dup && brace);
    if (dup && brace) {
        int head = (int)(brace - orig) + 1;
        snprintf(dup, len + 512, "%.*s\"%s\": \"%s\", %s", head, orig, name, f2, brace + 1);
        make_index_dir(dir, dup);
        CHECK_STATUS(open_index(dir, &err), KVQ_ERR_FORMAT);
        CHECKF(strstr(err.msg, "twice"), "%s", err.msg);
    }
    free(dup);
    /* a duplicate of a tensor in another shard: the index names one file,
     * the other holds a copy that would otherwise be taken first */
    char extra[300];
    snprintf(extra, sizeof extra, "%s/extra.safetensors", dir);
    kvq_st_writer *w;
    float one = 1.0f;
    int64_t shape[1] = {1};
    CHECK_OK(kvq_st_writer_create(&w));
    CHECK_OK(kvq_st_writer_add(w, name, KVQ_ST_F32, 1, shape, &one));
    CHECK_OK(kvq_st_writer_add(w, "extra.only", KVQ_ST_F32, 1, shape, &one));
    CHECK_OK(kvq_st_writer_write(w, extra, &err));
    kvq_st_writer_free(w);
    cJSON *r = cJSON_Duplicate(root, 1);
    cJSON_AddStringToObject(cJSON_GetObjectItem(r, "weight_map"), "extra.only", "extra.safetensors");
    char *text = cJSON_Print(r);
    make_index_dir(dir, text);
    CHECK_STATUS(open_index(dir, &err), KVQ_ERR_FORMAT);
    CHECKF(strstr(err.msg, "extra.safetensors holds") && strstr(err.msg, name), "%s", err.msg);
    cJSON_free(text);
    cJSON_Delete(r);
    unlink(extra);
    cJSON_Delete(root);
    free(orig);
    rm_flat(dir);
}

int main(void)
{
    strcpy(tmp, "/tmp/kvq_test_files_XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_out_file);
    RUN(test_out_file_errors);
    RUN(test_shard_out_rules);
    RUN(test_two_writers);
    RUN(test_killed_writer);
    RUN(test_index_weight_map);
    remove_leftovers();
    rm_flat(tmp);
    return TEST_END("test_file_safety");
}
