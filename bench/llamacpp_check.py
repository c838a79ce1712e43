#!/usr/bin/env python3
"""llamacpp_check.py - checks that bench/gguf_write.py's GGUF makes llama.cpp
compute the bundled model: on the fixture prompts (models/kvq-tiny-llama/
reference, produced by transformers in float32) llama.cpp's logits are
compared with the reference logits and its 24 greedy tokens with the
reference's and with kvq's (f32 cache); and llama.cpp's tokenizer with the
fixture's 44 tokenizer cases (informative: the bench feeds ids, never text).

  python3 bench/llamacpp_check.py KVQ_BIN PREFILL_LLAMACPP MODEL.gguf [--json OUT]

Exit 1 when a greedy continuation differs or a logit is off by more than
--tol (relative to the largest |logit| of that row), 0 otherwise."""
import argparse, json, os, struct, subprocess, sys, tempfile

MODEL = "models/kvq-tiny-llama"


def safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            fmt = {"F32": "f", "I32": "i"}[v["dtype"]]
            out[k] = (v["shape"], struct.unpack(f"<{len(raw) // 4}{fmt}", raw))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvq")
    ap.add_argument("llama")
    ap.add_argument("gguf")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--json")
    a = ap.parse_args()
    ref = json.load(open(os.path.join(MODEL, "reference", "reference.json")))
    st = safetensors(os.path.join(MODEL, "reference", "reference.safetensors"))
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for case in ref["cases"]:
            name = case["name"]
            ids = list(st[name + ".ids"][1])
            pos = list(st[name + ".logit_positions"][1])
            shape, logits = st[name + ".logits"]
            V = shape[1]
            want = list(st[name + ".greedy"][1])
            idf, lf = os.path.join(tmp, "ids"), os.path.join(tmp, "logits")
            with open(idf, "w") as f:
                f.write(",".join(map(str, ids)))
            out = subprocess.run([a.llama, "-m", a.gguf, "--ids", idf, "-t", "2", "-r", "1", "-n", str(len(want)),
                                  "--ctk", "f32", "--logits-at", ",".join(map(str, pos)), "--logits-out", lf],
                                 check=True, capture_output=True, text=True).stdout
            d = json.loads(out)
            raw = open(lf, "rb").read()
            got = struct.unpack(f"<{len(raw) // 4}f", raw)
            worst = 0.0
            for r in range(len(pos)):
                rr = logits[r * V:(r + 1) * V]
                gg = got[r * V:(r + 1) * V]
                scale = max(abs(x) for x in rr)
                worst = max(worst, max(abs(x - y) for x, y in zip(rr, gg)) / scale)
            kv = json.loads(subprocess.run([a.kvq, "run", "-m", MODEL, "--prompt-ids", ",".join(map(str, ids)), "-n",
                                            str(len(want)), "--no-eos", "--json", "-ctk", "f32", "-ctv", "f32"],
                                           check=True, capture_output=True, text=True).stdout)
            kvq_greedy = kv["ids"][-len(want):] if len(kv["ids"]) >= len(want) else kv["ids"]
            row = {"case": name, "tokens": len(ids), "max_rel_logit_diff": worst,
                   "greedy_eq_reference": d["greedy"] == want, "greedy_eq_kvq_f32": d["greedy"] == kvq_greedy,
                   "kvq_f32_eq_reference": kvq_greedy == want}
            ok &= worst <= a.tol and row["greedy_eq_kvq_f32"]
            rows.append(row)
            print(f"{name:12} {len(ids):5d} tokens  logits max |diff|/max|ref| {worst:.2e}  greedy = reference "
                  f"{row['greedy_eq_reference']}, = kvq f32 {row['greedy_eq_kvq_f32']} (kvq = reference "
                  f"{row['kvq_f32_eq_reference']})")
        cases = json.load(open(os.path.join(MODEL, "reference", "tokenizer_cases.json")))
        same = 0
        for c in cases:
            r = subprocess.run([a.llama, "-m", a.gguf, "--tokenize"], input=c["text"], check=True,
                               capture_output=True, text=True)
            got = json.loads(r.stdout)["ids"]
            same += got[1:] == c["ids"] if got[:1] == [ref["bos_token_id"]] else got == c["ids"]
        print(f"tokenizer: llama.cpp's ids = the fixture's in {same} of {len(cases)} cases")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"check": "llamacpp_gguf", "gguf": os.path.basename(a.gguf), "tol": a.tol, "cases": rows,
                       "tokenizer_cases_equal": same, "tokenizer_cases": len(cases)}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
