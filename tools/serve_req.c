/* serve_req.c - a `kvq serve` request from parsed params: the chat rendered
 * through the template, the prompt tokenized with every byte, the context
 * and the pool checked, the sampler made. Every refusal carries the OpenAI
 * code of its kind (serve.h lists them) so that clients can branch on it:
 * only a prompt + max_tokens over the context is context_length_exceeded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "serve_engine_int.h"

/* Request conditions run on CLOCK_MONOTONIC, as serve_wait's deadlines. */
static void cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* NUL bytes in message contents: cJSON prints a string only up to its first
 * NUL, and the renderer reads the messages back the same way, so each NUL
 * crosses the template as 0xFF, a byte UTF-8 never holds (the parser checked
 * every content), and is put back in the rendered text. @return how many. */
static size_t hide_nuls(cJSON *msgs)
{
    size_t n = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        const size_t len = serve_json_strlen(c);
        for (size_t i = 0; i < len; i++)
            if (c->valuestring[i] == 0)
                c->valuestring[i] = (char)0xFF, n++;
    }
    return n;
}

/* Chat messages -> prompt text through the model's template (kvq_chat.h),
 * BOS/EOS spelled as the tokenizer spells them. The text is tokenized
 * without an added BOS, as transformers' apply_chat_template(tokenize=True):
 * a template that wants one writes bos_token itself. */
static int render_chat(struct serve_engine *e, struct serve_req *r, char *err, size_t cap, const char **code)
{
    if (!e->cfg.chat) {
        snprintf(err, cap, "%s", e->cfg.chat_missing ? e->cfg.chat_missing : "this server has no chat template");
        *code = "chat_template_missing";
        return 400;
    }
    const size_t nuls = hide_nuls(r->p.messages);
    char *msgs = cJSON_PrintUnformatted((const cJSON *)r->p.messages);
    if (!msgs) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    kvq_chat_options opt = kvq_chat_options_default();
    const char *piece;
    size_t n;
    char bos[64] = "", eos[64] = "";
    if (kvq_tokenizer_piece(e->tok, kvq_tokenizer_bos_id(e->tok), &piece, &n) == KVQ_OK && n < sizeof bos)
        memcpy(bos, piece, n), bos[n] = 0, opt.bos_token = bos;
    if (kvq_tokenizer_piece(e->tok, kvq_tokenizer_eos_id(e->tok), &piece, &n) == KVQ_OK && n < sizeof eos)
        memcpy(eos, piece, n), eos[n] = 0, opt.eos_token = eos;
    kvq_error kerr = {0};
    kvq_status st = kvq_chat_render_json(e->cfg.chat, msgs, &opt, &r->p.prompt, &r->p.prompt_len, &kerr);
    free(msgs);
    if (st == KVQ_ERR_NOMEM) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    if (st != KVQ_OK) {
        snprintf(err, cap, "the chat template cannot render these messages: %s", kerr.msg);
        *code = "chat_template_error";
        return 400;
    }
    for (size_t i = 0; nuls && i < r->p.prompt_len; i++)
        if ((unsigned char)r->p.prompt[i] == 0xFF)
            r->p.prompt[i] = 0;
    return 0;
}

/* r's prompt ids: given, or tokenized from every byte of the text. */
static int prompt_ids(struct serve_engine *e, struct serve_req *r, char *err, size_t cap, const char **code)
{
    const int32_t vocab = kvq_model_config_of(e->m)->vocab;
    if (r->p.prompt_ids) {
        r->ids = r->p.prompt_ids;
        r->n_prompt = r->p.n_prompt_ids;
        r->p.prompt_ids = NULL;
        for (size_t i = 0; i < r->n_prompt; i++)
            if (r->ids[i] >= vocab) {
                snprintf(err, cap, "prompt token id %d (at %zu) is outside the vocabulary [0, %d)", r->ids[i], i,
                         vocab);
                *code = "token_id_out_of_vocabulary";
                return 400;
            }
        return 0;
    }
    const char *text = r->p.prompt ? r->p.prompt : "";
    kvq_status st = kvq_tokenizer_encode_alloc(e->tok, text, r->p.prompt_len, !r->p.chat, &r->ids, &r->n_prompt);
    if (st == KVQ_OK)
        return 0;
    if (st == KVQ_ERR_NOMEM) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    if (st == KVQ_ERR_INVALID_ARG) { /* the parser checked the fields; a template can still make bad bytes */
        snprintf(err, cap, "the prompt is not valid UTF-8 (byte %zu of %zu)", serve_utf8_check(text, r->p.prompt_len),
                 r->p.prompt_len);
        *code = "invalid_utf8";
    } else if (st == KVQ_ERR_UNSUPPORTED) {
        snprintf(err, cap, "the prompt has a character this tokenizer has no token for (and no byte fallback)");
        *code = "unsupported_character";
    } else {
        snprintf(err, cap, "the prompt cannot be tokenized: %s", kvq_status_str(st));
        *code = "invalid_value";
    }
    return 400;
}

struct serve_req *serve_req_create(struct serve_engine *e, struct serve_params *p, int *status, char *err,
                                   size_t cap, const char **code)
{
    const struct kvq_model_config *c = kvq_model_config_of(e->m);
    struct serve_req *r = calloc(1, sizeof *r);
    *code = NULL;
    if (!r) {
        snprintf(err, cap, "out of memory");
        *status = 503;
        return NULL;
    }
    cond_init(&r->cond);
    r->e = e;
    r->refs = 1;
    r->p = *p;
    memset(p, 0, sizeof *p); /* r owns the params now */
    r->slot = -1;
    *status = 400;
    if (r->p.has_types && (r->p.type_k != (int)e->cfg.batch.seq.type_k || r->p.type_v != (int)e->cfg.batch.seq.type_v)) {
        snprintf(err, cap, "this server's page pool holds %s caches; 'kvq' asked for %s/%s", e->cfg.cache_name,
                 kvq_type_traits((enum kvq_type)r->p.type_k)->name, kvq_type_traits((enum kvq_type)r->p.type_v)->name);
        *code = "cache_type_mismatch";
        goto fail;
    }
    if ((r->p.chat && (*status = render_chat(e, r, err, cap, code)) != 0) ||
        (*status = prompt_ids(e, r, err, cap, code)) != 0)
        goto fail;
    *status = 400;
    for (int i = 0; i < r->p.n_bias; i++)
        if (r->p.bias_ids[i] >= c->vocab) {
            snprintf(err, cap, "logit_bias token id %d is outside the vocabulary [0, %d)", r->p.bias_ids[i], c->vocab);
            *code = "token_id_out_of_vocabulary";
            goto fail;
        }
    if (r->n_prompt == 0) {
        snprintf(err, cap, "the prompt is empty");
        *code = "empty_prompt";
        goto fail;
    }
    r->max_tokens = r->p.max_tokens > 0 ? r->p.max_tokens : r->p.chat ? 256 : 16;
    if (r->n_prompt >= e->max_ctx || (size_t)r->max_tokens > e->max_ctx - r->n_prompt) {
        snprintf(err, cap,
                 "this model's maximum context length is %zu tokens; the prompt has %zu tokens and max_tokens is "
                 "%d",
                 e->max_ctx, r->n_prompt, r->max_tokens);
        *code = "context_length_exceeded";
        goto fail;
    }
    r->pages = kvq_batch_pages_for(e->b, r->n_prompt + (size_t)r->max_tokens);
    if (r->pages > e->pages_total) {
        snprintf(err, cap,
                 "the request needs %zu KV pages (%zu prompt tokens + max_tokens %d) and the whole pool (--kv-budget) "
                 "holds %zu: it can never run",
                 r->pages, r->n_prompt, r->max_tokens, e->pages_total);
        *code = "kv_pool_exceeded";
        goto fail;
    }
    kvq_sampler_params sp = kvq_sampler_params_default();
    sp.temperature = r->p.temperature;
    sp.top_k = r->p.top_k;
    sp.top_p = r->p.top_p;
    serve_lock(e);
    sp.seed = r->p.has_seed ? r->p.seed : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + ++e->seq_no;
    snprintf(r->id, sizeof r->id, "%s-%lx%lu", r->p.chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL),
             ++e->seq_no);
    e->n_live++;
    serve_unlock(e);
    r->created = (long)time(NULL);
    int need_logits = r->p.logprobs >= 0 || r->p.n_bias > 0; /* the bias is added on the host */
    if (kvq_sampler_create(c->vocab, &sp, &r->smp) != KVQ_OK ||
        kvq_detok_create(e->tok, KVQ_DETOK_SKIP_CONTROL, &r->detok) != KVQ_OK ||
        !(r->out = malloc((size_t)r->max_tokens * sizeof *r->out)) ||
        (r->p.logprobs >= 0 && !(r->lps = calloc((size_t)r->max_tokens, sizeof *r->lps))) ||
        (need_logits && !(r->logits = malloc((size_t)c->vocab * sizeof *r->logits))) ||
        (e->cfg.speculative && !need_logits &&
         (!(r->hist = malloc((r->n_prompt + (size_t)r->max_tokens) * sizeof *r->hist)) ||
          kvq_ngram_create(0, r->n_prompt + (size_t)r->max_tokens, &r->ngram) != KVQ_OK))) {
        snprintf(err, cap, "out of memory for the request");
        *status = 503;
        *code = NULL;
        serve_req_release(e, r);
        return NULL;
    }
    if (r->hist)
        memcpy(r->hist, r->ids, r->n_prompt * sizeof *r->hist);
    return r;
fail:
    if (*status != 400)
        *code = NULL; /* out of memory: a server error, not the request's */
    serve_req_free(r);
    return NULL;
}
