// serve_client.cjs - kvq serve through the official `openai` npm client
// (tests/test_serve.sh installs the pinned version and runs this).
// Usage: node serve_client.cjs MODULE_DIR BASE_URL API_KEY MODEL REFERENCE_JSON CHAT(0|1)
// Prints "ok NAME" / "FAIL NAME: why" / "skip NAME: why" lines.
'use strict';
const [modDir, base, key, model, refPath, chatFlag] = process.argv.slice(2);
const OpenAI = require(modDir + '/node_modules/openai');
const fs = require('fs');

const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });
const ref = JSON.parse(fs.readFileSync(refPath, 'utf8'));
let failures = 0;
const ok = (n) => console.log('ok   ' + n);
const fail = (n, why) => { failures++; console.log('FAIL ' + n + ': ' + why); };
const check = (n, cond, why) => (cond ? ok(n) : fail(n, why));

async function completions() {
  const c = ref.cases.find((x) => x.name === 'prose');
  const n = c.greedy_ids.length;
  const r = await client.completions.create({ model, prompt: c.text, max_tokens: n, temperature: 0 });
  check('completions: greedy text equals HF greedy_text', r.choices[0].text === c.greedy_text,
        JSON.stringify(r.choices[0].text) + ' vs ' + JSON.stringify(c.greedy_text));
  check('completions: usage counts', r.usage.completion_tokens === n && r.usage.prompt_tokens === c.n_tokens,
        JSON.stringify(r.usage));
  const s = await client.completions.create({ model, prompt: c.text, max_tokens: n, temperature: 0, stream: true });
  let text = '', finish = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  check('completions: stream concatenates to the same text', text === r.choices[0].text && chunks > 1,
        JSON.stringify(text) + ' in ' + chunks + ' chunks');
  check('completions: stream ends with a finish_reason', finish === r.choices[0].finish_reason, String(finish));
  // stop strings: the text ends where the first one begins, streamed or not
  const full = r.choices[0].text, at = Math.floor(full.length / 2), stop = full.slice(at, at + 3);
  const cut = full.slice(0, full.indexOf(stop));
  const st = await client.completions.create({ model, prompt: c.text, max_tokens: n, temperature: 0, stop: [stop] });
  check('completions: stop string ends the text', st.choices[0].text === cut && st.choices[0].finish_reason === 'stop',
        JSON.stringify([stop, st.choices[0].text, cut, st.choices[0].finish_reason]));
  const ss = await client.completions.create({ model, prompt: c.text, max_tokens: n, temperature: 0, stop, stream: true });
  let stext = '';
  for await (const ch of ss) stext += ch.choices[0].text;
  check('completions: streamed stop string never leaks', stext === cut, JSON.stringify([stext, cut]));
  const lp = await client.completions.create({ model, prompt: c.text, max_tokens: 5, temperature: 0, logprobs: 3 });
  const L = lp.choices[0].logprobs;
  check('completions: logprobs shape', L && L.tokens.length === 5 && L.token_logprobs.every((v) => v <= 0) &&
        L.top_logprobs.every((o) => Object.keys(o).length <= 3), JSON.stringify(L));
  const a = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0.9, seed: 123 });
  const b = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0.9, seed: 123 });
  check('completions: same seed, same sampled text', a.choices[0].text === b.choices[0].text,
        JSON.stringify([a.choices[0].text, b.choices[0].text]));
}

async function chat() {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name a colour.' }];
  if (chatFlag !== '1') {
    try {
      await client.chat.completions.create({ model, messages, max_tokens: 4 });
      fail('chat: without a template', 'expected 400');
    } catch (e) {
      check('chat: without a template answers 400', e.status === 400, String(e.status) + ' ' + e.message);
    }
    return;
  }
  const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  check('chat: one assistant message', r.choices[0].message.role === 'assistant' &&
        typeof r.choices[0].message.content === 'string' && r.object === 'chat.completion', JSON.stringify(r));
  const s = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true,
                                                   stream_options: { include_usage: true } });
  let text = '', role = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    if (ch.choices[0].delta.role) role = ch.choices[0].delta.role;
    text += ch.choices[0].delta.content || '';
  }
  check('chat: stream deltas concatenate to the message', text === r.choices[0].message.content && role === 'assistant',
        JSON.stringify([text, r.choices[0].message.content, role]));
  check('chat: stream usage chunk', usage && usage.completion_tokens === r.usage.completion_tokens, JSON.stringify(usage));
}

async function errors() {
  const bad = new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong-key', maxRetries: 0 });
  try {
    await bad.completions.create({ model, prompt: 'x', max_tokens: 1 });
    fail('errors: wrong key', 'no error');
  } catch (e) {
    check('errors: wrong key is 401 AuthenticationError', e.status === 401 && e instanceof OpenAI.AuthenticationError,
          String(e.status));
  }
  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 });
    fail('errors: unknown model', 'no error');
  } catch (e) {
    check('errors: unknown model is 404', e.status === 404 && e.code === 'model_not_found', String(e.status) + e.code);
  }
  try {
    await client.completions.create({ model, prompt: 'x', max_tokens: 1, temperature: 5 });
    fail('errors: temperature 5', 'no error');
  } catch (e) {
    check('errors: temperature 5 is 400 naming the param', e.status === 400 && e.param === 'temperature',
          String(e.status) + ' ' + e.param);
  }
  const models = await client.models.list();
  check('models: lists the served model', models.data.length === 1 && models.data[0].id === model,
        JSON.stringify(models.data));
}

(async () => {
  for (const f of [completions, chat, errors]) {
    try {
      await f();
    } catch (e) {
      fail(f.name, e.stack || String(e));
    }
  }
  process.exit(failures ? 1 : 0);
})();
