#!/usr/bin/env python3
"""make_refs.py - the tokenizer test references from Hugging Face's Rust
`tokenizers` (Python binding), to cross-check the committed ones, which come
from the JavaScript implementation (make_refs.mjs).

  python3 tests/tokenizer/make_refs.py --data build/tokenizer-data --out DIR
  python3 tests/tokenizer/make_refs.py --data ... --out DIR --compare tests/tokenizer/expected

Writes DIR/<family>.json and DIR/variant_<name>.json in the same format
(ids, ids_special, decoded, prefix_decoded, special_skipped); --compare prints,
per family, how many cases agree with the files in that folder. Needs only
`tokenizers` and the tokenizer.json files (tests/tokenizer/fetch.sh).
"""
import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ["llama2", "llama3", "qwen3", "gemma3", "deepseek_v3", "gptoss"]


def main():
    from tokenizers import Tokenizer, __version__ as tv

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="build/tokenizer-data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cases = json.load(open(os.path.join(HERE, "cases.json"), encoding="utf-8"))["cases"]
    gen = "tokenizers %s (Rust, Python binding) via tests/tokenizer/make_refs.py" % tv

    def write(name, out):
        with open(os.path.join(a.out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump({"generator": gen, "cases": out}, f, ensure_ascii=False)
            f.write("\n")
        if a.compare:
            ref = json.load(open(os.path.join(a.compare, name + ".json"), encoding="utf-8"))["cases"]
            keys = [k for k in out[0] if k in ref[0]]
            same = sum(all(x[k] == y[k] for k in keys) for x, y in zip(out, ref))
            diff = ["%d:%s" % (i, k) for i, (x, y) in enumerate(zip(out, ref)) for k in keys if x[k] != y[k]]
            print("%-20s %d/%d cases agree (%s)%s" % (name, same, len(out), ", ".join(keys),
                                                     "; differ: " + " ".join(diff) if diff else ""))

    for fam in FAMILIES:
        path = os.path.join(a.data, fam, "tokenizer.json")
        if not os.path.exists(path):
            print(fam, "missing, skipped")
            continue
        tok = Tokenizer.from_file(path)
        out = []
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_sp = tok.encode(text, add_special_tokens=True).ids
            out.append({"ids": ids, "ids_special": ids_sp,
                        "decoded": tok.decode(ids, skip_special_tokens=False),
                        "prefix_decoded": tok.decode(ids[:(len(ids) + 1) // 2], skip_special_tokens=False),
                        "special_skipped": tok.decode(ids_sp, skip_special_tokens=True)})
        write(fam, out)

    variants = json.load(open(os.path.join(HERE, "variants.json"), encoding="utf-8"))["variants"]
    for v in variants:
        path = os.path.join(a.data, v["base"], "tokenizer.json")
        if not os.path.exists(path):
            continue
        tj = json.load(open(path, encoding="utf-8"))
        tj["added_tokens"].extend(v["added_tokens"])
        tj.update(v.get("replace", {}))
        tok = Tokenizer.from_str(json.dumps(tj))
        out = []
        for t in v["texts"]:
            ids = tok.encode(t, add_special_tokens=False).ids
            out.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                        "special_skipped": tok.decode(ids, skip_special_tokens=True)})
        write("variant_" + v["name"], out)


if __name__ == "__main__":
    main()
