// bench_tokenize_hf.mjs - the reference side of bench_tokenize: Hugging Face's
// JavaScript tokenizer (@huggingface/tokenizers, installed by
// tests/tokenizer/fetch.sh --node) encoding the same text, timed the same way
// (median of 3 encodes after one warm-up, process CPU time; one encode
// when it takes over 5 s).
//   node bench/bench_tokenize_hf.mjs DATA_DIR FAMILY TEXT_FILE
// Prints {"seconds": S, "n_ids": N, "hash": H} (H: FNV-1a over the ids, as
// bench_tokenize.c computes it, so both sides are seen to do the same work).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [dataDir, fam, textFile] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(dataDir), "node", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const tj = JSON.parse(fs.readFileSync(path.join(dataDir, fam, "tokenizer.json"), "utf8"));
const tc = JSON.parse(fs.readFileSync(path.join(dataDir, fam, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tj, tc);
const text = fs.readFileSync(textFile, "utf8");
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
let ids = tok.encode(text.slice(0, 1000), { add_special_tokens: false }).ids; // warm-up (JIT)
const times = [];
for (let r = 0; r < 3; r++) {
  const t0 = cpu();
  ids = tok.encode(text, { add_special_tokens: false }).ids;
  times.push(cpu() - t0);
  if (times[0] > 5) break; // a slow one: one run says enough
}
times.sort((a, b) => a - b);
let h = 0xcbf29ce484222325n;
for (const id of ids) { h ^= BigInt(id); h = (h * 0x100000001b3n) & 0xffffffffffffffffn; }
console.log(JSON.stringify({ seconds: times[times.length >> 1], n_ids: ids.length, hash: h.toString(16) }));
