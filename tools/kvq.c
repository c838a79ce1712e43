/* kvq.c - the kvq command: one binary, git-style subcommands.
 * Each subcommand is tools/cmd_NAME.c; this file only dispatches. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifndef KVQ_VERSION_STRING
#define KVQ_VERSION_STRING "0.1.0"
#endif

int cmd_types(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_shard(int argc, char **argv);
int cmd_codebook(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_ppl(int argc, char **argv);
int cmd_passkey(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);

static const struct cli_command commands[] = {
    {"types", "list cache types with their exact storage cost", cmd_types},
    {"run", "generate text with a Llama-family model on the compressed KV cache", cmd_run},
    {"shard", "split a Hugging Face model into layer / LM-head shards with a manifest", cmd_shard},
    {"codebook", "compute or print a Lloyd-Max codebook for rotated coordinates", cmd_codebook},
    {"eval", "attention error against compression on real q/k/v dumps, per cache type", cmd_eval},
    {"ppl", "perplexity of a text with the compressed KV cache in the loop", cmd_ppl},
    {"passkey", "passkey-retrieval accuracy per prompt length on the compressed KV cache", cmd_passkey},
    {"tokenize", "text -> token ids (or --decode ids -> text) with a tokenizer.json, exactly as HF", cmd_tokenize},
    {"serve", "OpenAI-compatible HTTP server batching many sequences over one compressed page pool", cmd_serve},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq COMMAND [options]   (kvq help COMMAND, or kvq COMMAND --help, for its options)\n"
               "       kvq --version\n\n"
               "kvq compresses transformer KV caches (TurboQuant: rotation + Lloyd-Max codes\n"
               "+ QJL sign residual) and runs Llama-family models on the compressed cache.\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  %-10s %s\n", "help", "kvq help COMMAND prints that command's options");
    fprintf(f, "\noptions take --opt VALUE or --opt=VALUE; llama.cpp's short forms work too: -m MODEL,\n"
               "-p PROMPT, -f FILE, -n N (--max-tokens), -c N (--ctx), -t N (--threads), -s SEED,\n"
               "-ctk/-ctv TYPE (--cache-type-k/-v; type names in any case). A file argument '-'\n"
               "reads standard input.\n" CLI_SIZE_HELP ".\n"
               "exit status: 0 done, 1 the work failed (also: writing the output failed),\n"
               "2 bad usage or bad input; kvq run also 3 (stopped early, see its --help)\n");
}

static const struct cli_command *find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

/* Runs a command on normalized arguments (cli_normalize_args), then checks
 * that everything it printed reached stdout. */
static int dispatch(const struct cli_command *c, int argc, char **argv)
{
    int n;
    char **args = cli_normalize_args(argc, argv, &n);
    if (!args) {
        fprintf(stderr, "kvq %s: error: out of memory\n", c->name);
        return 1;
    }
    int rc = c->run(n, args);
    free(args);
    return cli_finish_stdout(c->name, rc);
}

/* OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE or
 * its table of CPU models; 0.3.21 (Debian 12) does not know recent Xeons
 * (family 6 model 207 here) and falls back to its SSE3 "Prescott" kernels:
 * sgemm then ran at 30 GFLOPS on one core against 127 with its AVX-512 ones
 * (issue 44; OPENBLAS_VERBOSE=2 prints the choice). On such a CPU with
 * AVX-512 the command runs itself again with the core named. The user's
 * own OPENBLAS_CORETYPE is never overridden. */
static void openblas_core_fix(char **argv)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (getenv("OPENBLAS_CORETYPE") || strcmp(openblas_get_corename(), "Prescott") != 0)
        return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq"))
        return;
    if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1) == 0)
        execv("/proc/self/exe", argv); /* returns only on failure: go on with the slow kernels */
#else
    (void)argv;
#endif
}

int main(int argc, char **argv)
{
    openblas_core_fix(argv);
    /* Whole reports reach the file in cli_finish_stdout's flush, where a
     * failed write's errno is still known ("No space left on device"); with
     * stdio's 4 KiB buffer a longer one failed mid-way and lost the reason.
     * Streamed text is flushed by its command (cli_flush_stdout). */
    static char out_buf[1 << 16];
    setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : cli_finish_stdout("help", 0);
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("kvq %s\n", KVQ_VERSION_STRING);
        return cli_finish_stdout("version", 0);
    }
    if (strcmp(argv[1], "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return cli_finish_stdout("help", 0);
        }
        const struct cli_command *c = find(argv[2]);
        if (!c) {
            fprintf(stderr, "kvq help: error: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        char help[] = "--help";
        char *args[] = {argv[2], help, NULL};
        return dispatch(c, 2, args);
    }
    const struct cli_command *c = find(argv[1]);
    if (c)
        return dispatch(c, argc - 1, argv + 1);
    fprintf(stderr, "kvq: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
