/* cmd_tokenize.c - `kvq tokenize`: text -> ids, or ids -> text, with a
 * model's tokenizer.json and no model weights (kvq_tokenizer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvq_tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvq tokenize (--tokenizer FILE | --model DIR) (--text S | --file F) [--no-bos] [--json]\n"
               "       kvq tokenize (--tokenizer FILE | --model DIR) --decode IDS [--skip-special] [--json]\n\n"
               "Encodes text with a Hugging Face tokenizer.json exactly as HF tokenizers does\n"
               "(added tokens, normalizer, pre-tokenizer, BPE, post-processor) and prints the\n"
               "ids on one line; or decodes ids back to text.\n\n"
               "  --tokenizer FILE  a tokenizer.json\n"
               "  --model DIR       a model directory holding tokenizer.json\n"
               "  --text S          the text to encode\n"
               "  --file F, -f F    encode the contents of F ('-' = standard input)\n"
               "  --no-bos          no special tokens around the text (the post-processor's BOS/EOS;\n"
               "                    HF add_special_tokens=False)\n"
               "  --decode IDS      ids separated by commas or spaces, e.g. \"128000,9906,1917\"\n"
               "  --skip-special    with --decode: leave special tokens out\n"
               "  --json            print {\"ids\": [...]} (or {\"text\": ...} with --decode)\n");
}

/* Parses "1,2, 3 4" into ids. @return 0, or -1 with *bad at the offending token. */
static int parse_ids(const char *s, int32_t **ids, size_t *n, const char **bad)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return -1;
    while (*s) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '[' || *s == ']')
            s++;
        if (!*s)
            break;
        size_t k = strcspn(s, ", \t\n[]");
        char tok[32];
        long v;
        if (k >= sizeof tok) {
            *bad = s;
            return -1;
        }
        memcpy(tok, s, k);
        tok[k] = 0;
        if (cli_parse_int(tok, 0, KVQ_TOKENIZER_MAX_VOCAB - 1, &v)) {
            *bad = s;
            return -1;
        }
        if (*n == cap) {
            int32_t *nv = realloc(*ids, 2 * cap * sizeof *nv);
            if (!nv)
                return -1;
            *ids = nv;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s += k;
    }
    return 0;
}

/* s[0..n) as a JSON string, every byte kept: cJSON's escapes for quotes,
 * backslashes and control bytes, but from a length, so a NUL the ids decode
 * to is written as \u0000 instead of ending the text (cJSON_CreateString
 * stops there). */
static void print_json_string(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                      : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (e)
            fputs(e, stdout);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static int print_json_ids(const int32_t *ids, size_t n)
{
    fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++)
        printf(i ? ", %d" : "%d", ids[i]);
    fputs("]}\n", stdout);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *tok_path = NULL, *model = NULL, *text = NULL, *file = NULL, *decode = NULL;
    int no_bos = 0, json = 0, skip_special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = NULL;
        /* "--opt=value" that cli_normalize_args left whole (it follows a flag
         * of ours it does not know, e.g. --no-bos): split it here. */
        char opt_buf[64];
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        const char *inline_value = NULL;
        if (eq && (size_t)(eq - a) < sizeof opt_buf) {
            memcpy(opt_buf, a, (size_t)(eq - a));
            opt_buf[eq - a] = 0;
            a = opt_buf;
            inline_value = eq + 1;
        }
        if (cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-bos") == 0) {
            no_bos = 1;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--skip-special") == 0) {
            skip_special = 1;
        } else if (strcmp(a, "--tokenizer") == 0) {
            slot = &tok_path;
        } else if (strcmp(a, "--model") == 0) {
            slot = &model;
        } else if (strcmp(a, "--text") == 0 || strcmp(a, "--prompt") == 0) {
            slot = &text;
        } else if (strcmp(a, "--file") == 0 || strcmp(a, "-f") == 0 || strcmp(a, "--prompt-file") == 0) {
            slot = &file;
        } else if (strcmp(a, "--decode") == 0) {
            slot = &decode;
        } else {
            usage(stderr);
            return cli_error("tokenize", "unknown option '%s'", a);
        }
        if (slot) {
            if (inline_value)
                *slot = inline_value;
            else if (i + 1 >= argc)
                return cli_error("tokenize", "%s needs a value", a);
            else
                *slot = argv[++i];
        } else if (inline_value) {
            return cli_error("tokenize", "%s takes no value", a);
        }
    }
    if (!!tok_path + !!model != 1)
        return cli_error("tokenize", "give exactly one of --tokenizer FILE and --model DIR");
    if (!!text + !!file + !!decode != 1)
        return cli_error("tokenize", "give exactly one of --text S, --file F and --decode IDS");

    char path_buf[4096];
    if (model) {
        int k = snprintf(path_buf, sizeof path_buf, "%s/tokenizer.json", model);
        if (k < 0 || (size_t)k >= sizeof path_buf)
            return cli_error("tokenize", "--model: path too long");
        tok_path = path_buf;
    }
    kvq_tokenizer *tok = NULL;
    kvq_error err = {KVQ_OK, ""};
    kvq_status st = kvq_tokenizer_create(tok_path, &tok, &err);
    if (st)
        return cli_error("tokenize", "%s", err.msg);

    int rc = 0;
    if (decode) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *bad = NULL;
        char *out = NULL;
        size_t len = 0;
        if (parse_ids(decode, &ids, &n, &bad)) {
            rc = bad ? cli_error("tokenize", "--decode: '%.20s' is not a token id", bad)
                     : cli_status_error("tokenize", KVQ_ERR_NOMEM, "parsing --decode");
        } else if ((st = kvq_tokenizer_decode_alloc(tok, ids, n, skip_special ? KVQ_DETOK_SKIP_SPECIAL : 0, &out,
                                                    &len))) {
            rc = st == KVQ_ERR_RANGE ? cli_error("tokenize", "--decode: an id is outside the vocabulary (size %d)",
                                                 kvq_tokenizer_vocab_size(tok))
                                     : cli_status_error("tokenize", st, "decoding");
        } else if (json) {
            fputs("{\"text\": ", stdout);
            print_json_string(out, len);
            fputs("}\n", stdout);
        } else {
            fwrite(out, 1, len, stdout);
            fputc('\n', stdout);
        }
        free(out);
        free(ids);
    } else {
        size_t len = text ? strlen(text) : 0;
        char *buf = NULL;
        if (file && !(buf = cli_read_text("tokenize", file, "the text", &len))) {
            kvq_tokenizer_free(tok);
            return 2;
        }
        const char *src = buf ? buf : text;
        if (!buf && cli_utf8_invalid_at(src, len) >= 0) {
            kvq_tokenizer_free(tok);
            return cli_error("tokenize", "--text is not valid UTF-8");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = kvq_tokenizer_encode_alloc(tok, src, len, !no_bos, &ids, &n);
        if (st == KVQ_ERR_UNSUPPORTED)
            rc = cli_error("tokenize", "the text has a character this tokenizer has no token for");
        else if (st)
            rc = cli_status_error("tokenize", st, "encoding");
        else if (json)
            print_json_ids(ids, n);
        else {
            for (size_t i = 0; i < n; i++)
                printf(i ? " %d" : "%d", ids[i]);
            fputc('\n', stdout);
        }
        free(ids);
        free(buf);
    }
    kvq_tokenizer_free(tok);
    return rc;
}
