/* eval_plot.c - error against bits per value, through gnuplot.
 *
 * gnuplot runs as a child process on a temporary data file and script, so
 * kvq needs no plotting library; without gnuplot only --plot fails. */
#include "eval_output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvq_file.h"

static int is_floor(const struct kvq_eval_config *c)
{
    return c->type_k == KVQ_TYPE_F32 && c->type_v == KVQ_TYPE_F32;
}

/* 0: both sides compressed; 1: only K (V kept at f16/f32); 2: only V. */
static int group_of(const struct kvq_eval_config *c)
{
    int kfull = c->type_k == KVQ_TYPE_F16 || c->type_k == KVQ_TYPE_F32;
    int vfull = c->type_v == KVQ_TYPE_F16 || c->type_v == KVQ_TYPE_F32;
    if (!kfull && vfull)
        return 1;
    if (kfull && !vfull)
        return 2;
    return 0;
}

void eval_plot_path(const char *png_path, const struct eval_run *run, size_t n_runs, char *out, size_t out_len)
{
    if (n_runs <= 1) {
        snprintf(out, out_len, "%s", png_path);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "%s", run->data->name);
    char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".safetensors") == 0)
        *dot = '\0';
    const char *slash = strrchr(png_path, '/');
    const char *ext = strrchr(png_path, '.');
    if (!ext || (slash && ext < slash))
        snprintf(out, out_len, "%s-%s", png_path, name);
    else
        snprintf(out, out_len, "%.*s-%s%s", (int)(ext - png_path), png_path, name, ext);
}

/* Front points of one metric, sorted by bits, as one gnuplot data block. */
static void write_front(FILE *f, const struct eval_run *run, int kl)
{
    size_t idx[KVQ_EVAL_MAX_CONFIGS], n = 0;
    for (size_t i = 0; i < run->n_res && n < KVQ_EVAL_MAX_CONFIGS; i++)
        if (kl ? run->res[i].front_kl : run->res[i].front_out)
            idx[n++] = i;
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && run->res[idx[b]].cost.bits < run->res[idx[b - 1]].cost.bits; b--) {
            size_t t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
    for (size_t a = 0; a < n; a++) {
        struct kvq_eval_stats m;
        kvq_eval_stats_of(&run->res[idx[a]].total, &m);
        fprintf(f, "%.6f %.9g\n", run->res[idx[a]].cost.bits, kl ? m.kl : m.out_err);
    }
    if (n == 0)
        fprintf(f, "NaN NaN\n");
    fprintf(f, "\n\n");
}

static int write_data(FILE *f, const struct eval_run *run)
{
    /* block 0: every configuration but the floor; columns bits, out_err,
     * KL, label, group, lossless in out_err, lossless in KL */
    for (size_t i = 0; i < run->n_res; i++) {
        const struct eval_result *r = &run->res[i];
        struct kvq_eval_stats m;
        kvq_eval_stats_of(&r->total, &m);
        if (is_floor(&r->cfg))
            continue;
        fprintf(f, "%.6f %.9g %.9g \"%s\" %d %d %d\n", r->cost.bits, m.out_err, m.kl, r->cfg.label,
                group_of(&r->cfg), eval_is_lossless(run, r, 0), eval_is_lossless(run, r, 1));
    }
    fprintf(f, "NaN NaN NaN \"\" 9 1 1\n\n\n"); /* keeps the block non-empty */
    write_front(f, run, 0); /* block 1 */
    write_front(f, run, 1); /* block 2 */
    return ferror(f) ? -1 : 0;
}

/* One line under a panel: the floor and the configurations left off as lossless. */
static void floor_note(FILE *s, const struct eval_run *run, int which)
{
    char note[512];
    size_t used = 0;
    note[0] = '\0';
    for (size_t i = 0; i < run->n_res; i++) {
        const struct eval_result *r = &run->res[i];
        struct kvq_eval_stats m;
        kvq_eval_stats_of(&r->total, &m);
        if (is_floor(&r->cfg))
            used += (size_t)snprintf(note + used, sizeof note - used, "f32 cache (floor): %.2g", which ? m.kl : m.out_err);
        if (used >= sizeof note)
            break;
    }
    int first = 1;
    for (size_t i = 0; i < run->n_res && used < sizeof note; i++) {
        const struct eval_result *r = &run->res[i];
        if (!eval_is_lossless(run, r, which))
            continue;
        used += (size_t)snprintf(note + used, sizeof note - used, "%s%s", first ? ";  at the floor, not shown: " : ", ",
                                 r->cfg.label);
        first = 0;
    }
    fprintf(s, "set label 1 '%s' at graph 0.01, graph 0.03 left font ',8' tc rgb '#555555'\n", note);
}

static void panel(FILE *s, const struct eval_run *run, const char *dat, int which, const char *ylabel)
{
    const int col = which ? 3 : 2, lcol = which ? 7 : 6, front_block = which ? 2 : 1;
    floor_note(s, run, which);
    fprintf(s, "set ylabel '%s'\n", ylabel);
    fprintf(s, "plot '%s' index 0 using 1:($5==0 && $%d==0 ? $%d : 1/0) with points pt 7 ps 1.2 lc rgb '#4477aa' "
               "title 'K and V compressed', \\\n",
            dat, lcol, col);
    fprintf(s, "  '' index 0 using 1:($5==1 && $%d==0 ? $%d : 1/0) with points pt 5 ps 1.1 lc rgb '#228833' "
               "title 'K only (V f16)', \\\n",
            lcol, col);
    fprintf(s, "  '' index 0 using 1:($5==2 && $%d==0 ? $%d : 1/0) with points pt 9 ps 1.3 lc rgb '#ccbb44' "
               "title 'V only (K f16)', \\\n",
            lcol, col);
    fprintf(s, "  '' index 0 using 1:($%d==0 ? $%d : 1/0):4 with labels offset 0.5,0.5 left font ',7' "
               "tc rgb '#333333' notitle, \\\n",
            lcol, col);
    fprintf(s, "  '' index %d using 1:2 with linespoints lw 2 pt 6 ps 2 lc rgb '#cc3311' title 'Pareto front'\n",
            front_block);
}

/* The first line gnuplot wrote to errs (its own complaint), "" if none. */
static void first_line(const char *errs, char *line, size_t cap)
{
    line[0] = 0;
    FILE *f = fopen(errs, "r");
    char buf[512];
    while (f && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\r\n")] = 0;
        const char *p = buf + strspn(buf, " \t^");
        if (*p) {
            snprintf(line, cap, ": %s", p);
            break;
        }
    }
    if (f)
        fclose(f);
}

static int run_gnuplot(const char *script, const char *term, const char *errs, char *why, size_t why_len)
{
    char cmd[1536];
    int n = snprintf(cmd, sizeof cmd, "gnuplot -e \"set terminal %s\" '%s' 2>'%s'", term, script, errs);
    if (n < 0 || (size_t)n >= sizeof cmd) {
        snprintf(why, why_len, "temporary path too long");
        return -1;
    }
    int rc = system(cmd);
    if (rc == 0)
        return 0;
    char said[200];
    first_line(errs, said, sizeof said);
    /* system() returns a wait status, not gnuplot's exit code */
    if (rc == -1)
        snprintf(why, why_len, "cannot start gnuplot");
    else if (WIFEXITED(rc))
        snprintf(why, why_len, "gnuplot exited with status %d (terminal %s)%s", WEXITSTATUS(rc), term, said);
    else if (WIFSIGNALED(rc))
        snprintf(why, why_len, "gnuplot was killed by signal %d (terminal %s)", WTERMSIG(rc), term);
    else
        snprintf(why, why_len, "gnuplot failed (terminal %s)%s", term, said);
    return -1;
}

int eval_plot_check(const char *png_path, char *why, size_t why_len)
{
    if (strpbrk(png_path, "'\"\\\n$`")) {
        snprintf(why, why_len, "plot path '%s' has quotes or special characters", png_path);
        return -1;
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        snprintf(why, why_len, "gnuplot is not installed (--plot needs it: apt-get install gnuplot-nox)");
        return -1;
    }
    kvq_error err = {0};
    if (kvq_out_path_check(png_path, &err) != KVQ_OK) {
        snprintf(why, why_len, "%s", err.msg);
        return -1;
    }
    return 0;
}

int eval_plot(const char *png_path, const struct eval_run *run, char *why, size_t why_len)
{
    if (eval_plot_check(png_path, why, why_len))
        return -1;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strpbrk(tmp, "'\"\\\n$`"))
        tmp = "/tmp";
    char dat[512], scr[512], errs[520];
    snprintf(dat, sizeof dat, "%s/kvq-eval-XXXXXX", tmp);
    snprintf(scr, sizeof scr, "%s/kvq-eval-XXXXXX", tmp);
    kvq_out_file *png = NULL; /* gnuplot writes the temporary; commit renames it into place */
    kvq_error err = {0};
    int fd1 = mkstemp(dat), fd2 = fd1 < 0 ? -1 : mkstemp(scr);
    if (fd1 < 0 || fd2 < 0) {
        if (fd1 >= 0) {
            close(fd1);
            unlink(dat);
        }
        snprintf(why, why_len, "cannot create temporary files in %s", tmp);
        return -1;
    }
    snprintf(errs, sizeof errs, "%s.err", scr);
    FILE *fd = fdopen(fd1, "w"), *fs = fdopen(fd2, "w");
    int rc = -1;
    if (kvq_out_file_create(png_path, &png, &err) != KVQ_OK) {
        snprintf(why, why_len, "%s", err.msg);
        goto out;
    }
    if (!fd || !fs || write_data(fd, run)) {
        snprintf(why, why_len, "cannot write temporary plot data in %s", tmp);
        goto out;
    }
    const struct kvq_eval_data *d = run->data;
    /* The terminal comes from the command line so one script serves both
     * the cairo terminal and the plain gd fallback. */
    fprintf(fs, "set termoption noenhanced\nset output '%s'\n", kvq_out_file_temp_path(png));
    fprintf(fs, "set multiplot layout 1,2 title '%s: %d of %d layers, %zu tokens, %zu query positions, head dim %d'\n",
            d->name, run->n_layers, d->n_layers, d->n_tokens, run->queries_used, d->head_dim);
    /* x from 0 to just past the widest plotted point (lossless ones are not plotted) */
    double xmax = 1.0;
    for (size_t i = 0; i < run->n_res; i++) {
        const struct eval_result *r = &run->res[i];
        if (!is_floor(&r->cfg) && (!eval_is_lossless(run, r, 0) || !eval_is_lossless(run, r, 1)) &&
            r->cost.bits > xmax)
            xmax = r->cost.bits;
    }
    fprintf(fs, "set logscale y\nset grid\nset key top right font ',8'\nset format y '%%.0e'\n"
                "set xlabel 'bits per value (mean of K and V, norms and scales included)'\n"
                "set xrange [0:%.1f]\n",
            xmax * 1.12 + 0.5);
    panel(fs, run, dat, 0, "attention-output relative error (fused attention)");
    panel(fs, run, dat, 1, "KL(p || p~) of attention probabilities, nats");
    fprintf(fs, "unset multiplot\n");
    if (fclose(fd) | fclose(fs)) {
        fd = fs = NULL;
        snprintf(why, why_len, "cannot write temporary plot files in %s", tmp);
        goto out;
    }
    fd = fs = NULL;
    if (run_gnuplot(scr, "pngcairo size 1700,700 font 'sans,9'", errs, why, why_len) == 0 ||
        run_gnuplot(scr, "png size 1700,700", errs, why, why_len) == 0) {
        rc = kvq_out_file_commit(png, &err) == KVQ_OK ? 0 : -1;
        png = NULL;
        if (rc)
            snprintf(why, why_len, "%s", err.msg);
    }
out:
    kvq_out_file_free(png);
    unlink(errs);
    if (fd)
        fclose(fd);
    if (fs)
        fclose(fs);
    unlink(dat);
    unlink(scr);
    return rc;
}
