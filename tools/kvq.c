/* kvq.c - the kvq command: one binary, git-style subcommands.
 * Each subcommand is tools/cmd_NAME.c; this file only dispatches. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_types(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_shard(int argc, char **argv);
int cmd_codebook(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_ppl(int argc, char **argv);
int cmd_passkey(int argc, char **argv);

static const struct cli_command commands[] = {
    {"types", "list cache types with their exact storage cost", cmd_types},
    {"run", "generate text with a Llama-family model on the compressed KV cache", cmd_run},
    {"shard", "split a Hugging Face model into layer / LM-head shards with a manifest", cmd_shard},
    {"codebook", "compute or print a Lloyd-Max codebook for rotated coordinates", cmd_codebook},
    {"eval", "attention error against compression on real q/k/v dumps, per cache type", cmd_eval},
    {"ppl", "perplexity of a text with the compressed KV cache in the loop", cmd_ppl},
    {"passkey", "passkey-retrieval accuracy per prompt length on the compressed KV cache", cmd_passkey},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq COMMAND [options]   (kvq COMMAND --help for its options)\n\n"
               "kvq compresses transformer KV caches (TurboQuant: rotation + Lloyd-Max codes\n"
               "+ QJL sign residual) and runs Llama-family models on the compressed cache.\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvq 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvq: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
