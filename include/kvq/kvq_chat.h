/* kvq_chat.h - chat templates: a model's tokenizer_config.json "chat_template"
 * (Jinja) rendered over a conversation, as transformers' apply_chat_template does.
 *
 * kvq carries a small Jinja interpreter (decoder/chat/) that covers what the
 * templates of current instruct models use, with transformers' settings
 * (trim_blocks, lstrip_blocks, loop controls):
 *   statements  {% if/elif/else %}, {% for x in xs [if cond] %} (+ else,
 *               tuple targets, loop.index/index0/first/last/length/revindex/
 *               revindex0/previtem/nextitem), {% set x = ... %},
 *               {% set ns.attr = ... %}, {% set x %}...{% endset %},
 *               {% break %}/{% continue %}, {% generation %}, comments,
 *               whitespace control with '-' and '+';
 *   expressions literals (strings, numbers, true/false/none, lists, dicts),
 *               attribute and item access, slices [a:b:c], + - * / // % **,
 *               ~ (concatenation), comparisons, in / not in, and/or/not,
 *               a if c else b, tests (is [not] defined/undefined/none/string/
 *               number/integer/float/boolean/mapping/iterable/sequence/callable/
 *               true/false/odd/even/divisibleby/lower/upper/in/equalto/eq/ne/
 *               lt/gt/le/ge/sameas);
 *   filters     trim, tojson (indent, ensure_ascii, sort_keys, separators),
 *               length/count, upper, lower, capitalize, title, default/d,
 *               first, last, join, replace, list, string, int, float, abs,
 *               reverse, items, unique, safe, e/escape, indent,
 *               map(attribute=), select/reject, selectattr/rejectattr;
 *   methods     str: strip/lstrip/rstrip, split, startswith/endswith,
 *               upper/lower/title/capitalize, replace, find, count, join,
 *               isdigit, isspace; dict: items/keys/values/get;
 *   globals     namespace(...), range(...), raise_exception(msg),
 *               strftime_now(fmt) (UTC), dict(...).
 * Anything else (macros, include/import, extends/blocks, call blocks, unknown
 * filters, tests or methods) is an error naming the construct and its line,
 * at create time when the parser can tell, else at render time.
 *
 * A template is immutable once created and may be rendered from several
 * threads at once.
 */
#ifndef KVQ_CHAT_H
#define KVQ_CHAT_H

#include "kvq_export.h"

#include <stddef.h>

#include "kvq_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_chat_template kvq_chat_template;

/** One message: role ("system", "user", "assistant", ...) and text content. */
typedef struct kvq_chat_message {
    const char *role;
    const char *content;
} kvq_chat_message;

typedef struct kvq_chat_options {
    int add_generation_prompt; /* 1: end with the assistant header (default 1) */
    const char *bos_token;     /* the template's bos_token / eos_token; NULL: */
    const char *eos_token;     /*   the ones read from tokenizer_config.json, else "" */
    /* Optional JSON object whose members become template variables too
     * (e.g. {"enable_thinking": false}, {"tools": [...]}); NULL for none. */
    const char *extra_json;
} kvq_chat_options;

/** add_generation_prompt 1, everything else NULL. */
KVQ_API kvq_chat_options kvq_chat_options_default(void);

/** Parses template source src[0..len).
 *  @return KVQ_OK; KVQ_ERR_FORMAT (syntax error), KVQ_ERR_UNSUPPORTED (a
 *  construct outside the subset, named in err), KVQ_ERR_INVALID_ARG, KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_chat_template_create(const char *src, size_t len, kvq_chat_template **out,
                                            kvq_error *err);

/** Reads "chat_template" (a string, or the list form's "default" entry) and
 *  bos_token / eos_token (strings or {"content": ...}) from a
 *  tokenizer_config.json; path may also be a model directory holding one,
 *  where a chat_template.jinja file, when present, is the template.
 *  @return as kvq_chat_template_create; KVQ_ERR_IO; KVQ_ERR_FORMAT when the
 *  file has no chat_template. */
KVQ_API kvq_status kvq_chat_template_load(const char *path, kvq_chat_template **out, kvq_error *err);

/** Accepts NULL. */
KVQ_API void kvq_chat_template_free(kvq_chat_template *t);

/** Renders messages[0..n) into a malloc'ed NUL-terminated string (*text, free() it).
 *  opt may be NULL (defaults).
 *  @return KVQ_OK; KVQ_ERR_FORMAT for raise_exception (its message in err) or
 *  a type error in the template; KVQ_ERR_UNSUPPORTED for a construct outside
 *  the subset; KVQ_ERR_INVALID_ARG; KVQ_ERR_NOMEM. */
KVQ_API kvq_status kvq_chat_render(const kvq_chat_template *t, const kvq_chat_message *messages, size_t n,
                                   const kvq_chat_options *opt, char **text, size_t *len, kvq_error *err);

/** Same with the messages as a JSON array of objects (any members: role,
 *  content as a string or a list of parts, tool_calls, ...), as an
 *  OpenAI-style request carries them.
 *  @return as kvq_chat_render; KVQ_ERR_FORMAT when messages_json is not a JSON array. */
KVQ_API kvq_status kvq_chat_render_json(const kvq_chat_template *t, const char *messages_json,
                                        const kvq_chat_options *opt, char **text, size_t *len, kvq_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CHAT_H */
