#!/usr/bin/env python3
"""prefill_llamacpp.py - CPU prefill tok/s of kvq (`kvq run`, default cache
and f16) and of llama.cpp's CPU build (bench/prefill_llamacpp.c: f16 cache,
flash attention on, llama.cpp's default n_batch 2048 / n_ubatch 512) on the
same token ids, at 1 and 2 (and all) threads, in one sitting: every
repetition runs each configuration once, interleaved, so that all see the
same load. Medians of REPEAT.

  python3 bench/prefill_llamacpp.py BUILD [--base OTHER_KVQ] [--repeat N] [--prompts 3.5k,16k]
                                    [--weights bf16,f16] [--out NAME.json]

--base adds another kvq binary (e.g. the branch point's) to the same sitting.

Prompts: models/passkey-3500.txt (3,515 tokens) and a 16K passkey prompt of
the same format (written to build/llama/passkey-16k.txt); kvq tokenizes
each once and both programs get those ids. The bundled model's context is
4,096 tokens: the 16K runs use a copy of its config with
max_position_embeddings 16384 (build/llama/kvq-tiny-llama-16k, the weights
linked) and a GGUF with context 16384; RoPE "default" does not depend on the
context, so the arithmetic per token is the model's own, only the outputs
past 4K are extrapolation (a speed measurement, not a quality one).

llama.cpp's weights: bf16 is the checkpoint's own bits (what kvq reads);
f16 is the type llama.cpp is usually run with (faster matrix products here).
Prints a table, writes bench_prefill_llamacpp.json to $KVQ_BENCH_JSON_DIR
(default BUILD/bench). Measures only: exit 1 only when a run fails or
kvq's greedy ids differ across thread counts."""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill_cpu import spare_cores  # noqa: E402  (one probe of the free cores for both benches)

MODEL = "models/kvq-tiny-llama"
LL = "build/llama"
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there. ")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
CACHES = {"default": [], "f16": ["-ctk", "f16", "-ctv", "f16"]}


def model_16k():
    d = os.path.join(LL, "kvq-tiny-llama-16k")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(MODEL):
        if f != "config.json" and not os.path.exists(os.path.join(d, f)):
            os.symlink(os.path.abspath(os.path.join(MODEL, f)), os.path.join(d, f))
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    cfg["max_position_embeddings"] = 16384
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return d


def prompt_16k():
    p = os.path.join(LL, "passkey-16k.txt")
    # 43 tokens a filler: 370 of them + the frame stay just under 16,384
    text = INTRO + FILLER * 190 + " The pass key is 71432. Remember it. 71432 is the pass key. " + FILLER * 180 + \
        " What is the pass key? The pass key is"
    with open(p, "w") as f:
        f.write(text)
    return p


def kvq_run(kvq, model, args):
    out = subprocess.run([kvq, "run", "-m", model, "--json", "--no-eos"] + args, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--llama", default=os.path.join(LL, "prefill_llamacpp"))
    ap.add_argument("--repeat", type=int, default=int(os.environ.get("REPEAT", "3")))
    ap.add_argument("--prompts", default="3.5k,16k")
    ap.add_argument("--weights", default="bf16,f16", help="llama.cpp's weight types (GGUFs in build/llama/gguf)")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", default="")
    ap.add_argument("--base", help="another kvq binary measured alongside (e.g. the branch point's)")
    ap.add_argument("--out", default="bench_prefill_llamacpp.json")
    a = ap.parse_args()
    kvq = os.path.join(a.build, "bin", "kvq")
    kvqs = {"kvq": kvq, **({"kvq before": a.base} if a.base else {})}
    cores = os.cpu_count() or 1
    threads = [int(t) for t in a.threads.split(",")] if a.threads else sorted({1, 2, cores} if cores >= 2 else {1})
    prompts = {}
    for p in a.prompts.split(","):
        if p == "3.5k":
            prompts[p] = (MODEL, "models/passkey-3500.txt", "")
        elif p == "16k":
            prompts[p] = (model_16k(), prompt_16k(), "-16k")
        else:
            raise SystemExit(f"prefill_llamacpp: unknown prompt {p}")
    ids = {}
    for p, (model, text, sfx) in prompts.items():
        ids[p] = kvq_run(kvq, model, ["-f", text, "-n", "1"])["prompt_ids"]
        with open(os.path.join(LL, f"ids-{p}.txt"), "w") as f:
            f.write(",".join(map(str, ids[p])))
        for wt in a.weights.split(","):
            g = os.path.join(LL, "gguf", f"tiny-{wt}{sfx}.gguf")
            if not os.path.exists(g):
                subprocess.run([sys.executable, "bench/gguf_write.py", MODEL, g, "--type", wt] +
                               (["--ctx", "16384"] if sfx else []), check=True, capture_output=True)
    res, greedy = {}, {}
    spare = [spare_cores()]
    for rep in range(a.repeat):
        for p, (model, text, sfx) in prompts.items():
            idarg = ",".join(map(str, ids[p]))
            for th in threads:
                for cache, extra in CACHES.items():
                    for name, binary in kvqs.items():
                        d = kvq_run(binary, model, ["--prompt-ids", idarg, "-n", str(a.decode), "--threads", str(th)] +
                                    extra)
                        t = d["timings"]
                        res.setdefault((name, cache, p, th), []).append(
                            (t["prefill_tokens_per_s"], t["decode_tokens_per_s"], t.get("attention_s"),
                             t.get("matmul_s")))
                        greedy.setdefault((name, cache, p), set()).add(tuple(d["ids"]))
                for wt in a.weights.split(","):
                    g = os.path.join(LL, "gguf", f"tiny-{wt}{sfx}.gguf")
                    out = subprocess.run([a.llama, "-m", g, "--ids", os.path.join(LL, f"ids-{p}.txt"), "-t", str(th),
                                          "-r", "1", "-n", str(a.decode), "--ctk", "f16", "--fa", "on"],
                                         check=True, capture_output=True, text=True).stdout
                    d = json.loads(out)
                    res.setdefault((f"llama.cpp {wt} weights", "f16", p, th), []).append(
                        (d["prefill_tok_s"], d.get("decode_tok_s"), None, None))
                    sysinfo = d["system_info"]
    spare.append(spare_cores())
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows = []
    for (prog, cache, p, th), v in sorted(res.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1], kv[0][3])):
        med = lambda i: statistics.median(x[i] for x in v) if v[0][i] is not None else None
        rows.append({"program": prog, "cache": cache, "prompt": p, "prompt_tokens": len(ids[p]), "threads": th,
                     "runs": len(v), "prefill_tok_s": med(0), "decode_tok_s": med(1), "attention_s": med(2),
                     "matmul_s": med(3), "prefill_tok_s_runs": [x[0] for x in v]})
    same = {f"{n}/{c}/{p}": len(s) == 1 for (n, c, p), s in greedy.items()}
    print(f"prefill tok/s, kvq vs llama.cpp on the same ids; {cores} cores, load {load}; medians of {a.repeat}; "
          f"two busy loops ran x{spare[0]:.2f} / x{spare[1]:.2f} (before / after)")
    print(f"{'prompt':6} {'program':24} {'cache':8} {'threads':>7} {'prefill tok/s':>14} {'x vs 1 thr':>10} "
          f"{'attn s':>7} {'matmul s':>8} {'decode tok/s':>12}")
    for r in rows:
        one = next(x for x in rows if x["program"] == r["program"] and x["cache"] == r["cache"] and
                   x["prompt"] == r["prompt"] and x["threads"] == 1)
        f2 = lambda x: f"{x:.2f}" if x is not None else "-"
        print(f"{r['prompt']:6} {r['program']:24} {r['cache']:8} {r['threads']:7d} {r['prefill_tok_s']:14.0f} "
              f"{r['prefill_tok_s'] / one['prefill_tok_s']:10.2f} {f2(r['attention_s']):>7} {f2(r['matmul_s']):>8} "
              f"{r['decode_tok_s'] or 0:12.0f}")
    print("kvq greedy ids identical across thread counts: " +
          ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    out = os.environ.get("KVQ_BENCH_JSON_DIR", os.path.join(a.build, "bench"))
    os.makedirs(out, exist_ok=True)
    src = os.path.join(LL, "src")
    rev = subprocess.run(["git", "-C", src, "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    with open(os.path.join(out, a.out), "w") as f:
        json.dump({"bench": "prefill_llamacpp", "cores": cores, "load": load, "two_loops_speedup": spare,
                   "repeat": a.repeat, "prompts": {p: v[1] for p, v in prompts.items()},
                   "base": a.base, "llama_cpp": {"source": f"node-llama-cpp bundle, commit {rev}",
                                                      "system_info": sysinfo, "n_batch": 2048, "n_ubatch": 512,
                                                      "flash_attn": True, "cache": "f16"},
                   "rows": rows, "kvq_ids_identical_across_threads": same}, f, indent=1)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
