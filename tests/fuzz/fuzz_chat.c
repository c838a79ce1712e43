/* fuzz_chat.c - libFuzzer target for the chat-template interpreter.
 *
 * The first input byte picks what the rest is:
 *   even  a template, rendered over a fixed conversation (the parser and the
 *         evaluator on arbitrary source);
 *   odd   a messages JSON array, rendered with a fixed template that walks
 *         every message field (arbitrary data through a real template).
 * Besides "no crash, no sanitizer report", every failure must come with a
 * one-line message.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *k_template =
    "{%- set ns = namespace(sys='') -%}"
    "{%- if messages[0] is defined and messages[0]['role'] == 'system' -%}{%- set ns.sys = messages[0]['content'] -%}"
    "{%- endif -%}{{ bos_token }}{{ ns.sys | string | trim }}"
    "{%- for m in messages if m is mapping -%}"
    "<|{{ m.role | default('user') }}|>{% if m.content is string %}{{ m.content[:200] | trim }}"
    "{% elif m.content is iterable %}{% for p in m.content %}{{ p.text if p is mapping else p }}{% endfor %}"
    "{% else %}{{ m.content | tojson }}{% endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}{{ c | tojson(indent=1) }}{% endfor %}{% endif -%}"
    "{%- if loop.last and add_generation_prompt %}<|assistant|>{% endif -%}"
    "{%- endfor -%}";

static void check_err(kvq_status st, const kvq_error *err)
{
    if (st != KVQ_OK && (err->msg[0] == 0 || strchr(err->msg, '\n')))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    kvq_error err = {KVQ_OK, ""};
    kvq_chat_template *t = NULL;
    char *out = NULL;
    size_t len = 0;
    if (data[0] % 2 == 0) {
        kvq_status st = kvq_chat_template_create(rest, n, &t, &err);
        check_err(st, &err);
        if (st == KVQ_OK) {
            kvq_chat_message m[3] = {{"system", "Be brief."}, {"user", "  Hi \xf0\x9f\x91\x8b  "}, {"assistant", "Hello."}};
            st = kvq_chat_render(t, m, 3, NULL, &out, &len, &err);
            check_err(st, &err);
            if (st == KVQ_OK && (!out || strlen(out) > len))
                abort();
        }
    } else {
        kvq_status st = kvq_chat_template_create(k_template, strlen(k_template), &t, &err);
        if (st != KVQ_OK)
            abort(); /* the fixed template must parse */
        char *json = malloc(n + 1);
        if (!json) {
            kvq_chat_template_free(t);
            return 0;
        }
        memcpy(json, rest, n);
        json[n] = 0;
        kvq_chat_options o = kvq_chat_options_default();
        o.bos_token = "<s>";
        st = kvq_chat_render_json(t, json, &o, &out, &len, &err);
        check_err(st, &err);
        free(json);
    }
    free(out);
    kvq_chat_template_free(t);
    return 0;
}
