#!/usr/bin/env python3
"""prefill_cpu.py - CPU prefill tok/s of `kvq run` at 1, 2 (and all) threads,
default cache and f16, medians of REPEAT runs; optionally a second binary
(the build before a change) in the same sitting, runs interleaved so that
both see the same load.

  python3 bench/prefill_cpu.py BUILD [--base OTHER_KVQ] [--prompt F] [--repeat N]

Prints a table, writes bench_prefill_cpu.json to $KVQ_BENCH_JSON_DIR
(default BUILD/bench). Also checks that the greedy ids are the same at every
thread count (the logits do not depend on it). Measures only; never fails on
speed (exit 1 only when a run fails or the ids differ)."""
import argparse, json, os, statistics, subprocess, sys

CACHES = {"default": [], "f16": ["-ctk", "f16", "-ctv", "f16"]}


def run(kvq, model, prompt, threads, extra, n):
    cmd = [kvq, "run", "-m", model, "-f", prompt, "-n", str(n), "--no-eos", "--threads", str(threads), "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def spare_cores():
    """How many cores are free right now: the wall time of one busy loop over
    that of two at once (2.0 on an idle 2-core machine; a shared one gives
    less, and then so does any 2-thread number)."""
    import time
    loop = ["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]
    t0 = time.monotonic()
    subprocess.run(loop, check=True)
    t1 = time.monotonic()
    ps = [subprocess.Popen(loop) for _ in range(2)]
    for p in ps:
        p.wait()
    return 2 * (t1 - t0) / (time.monotonic() - t1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--base", help="another kvq binary to measure alongside (e.g. the branch point's)")
    ap.add_argument("--model", default="models/kvq-tiny-llama")
    ap.add_argument("--prompt", default="models/passkey-3500.txt")
    ap.add_argument("--repeat", type=int, default=int(os.environ.get("REPEAT", "3")))
    ap.add_argument("--decode", type=int, default=32, help="tokens generated after the prompt")
    a = ap.parse_args()
    bins = {"after": os.path.join(a.build, "bin", "kvq")}
    if a.base:
        bins = {"before": a.base, **bins}
    cores = os.cpu_count() or 1
    threads = sorted({1, 2, cores} if cores >= 2 else {1})
    res, ids = {}, {}
    spare = [spare_cores()]
    for rep in range(a.repeat):
        for cache, extra in CACHES.items():
            for th in threads:
                for name, kvq in bins.items():
                    d = run(kvq, a.model, a.prompt, th, extra, a.decode)
                    t = d["timings"]
                    res.setdefault((name, cache, th), []).append(t)
                    ids.setdefault((name, cache), set()).add(tuple(d["ids"]))
                    n_prompt = len(d["prompt_ids"])
    spare.append(spare_cores())
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows = []
    for (name, cache, th), ts in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        med = lambda k: statistics.median(t[k] for t in ts)
        rows.append({"binary": name, "cache": cache, "threads": th, "runs": len(ts),
                     "prefill_tok_s": med("prefill_tokens_per_s"), "decode_tok_s": med("decode_tokens_per_s"),
                     "prefill_s": med("prefill_s"), "attention_s": med("attention_s"), "matmul_s": med("matmul_s"),
                     "prefill_tok_s_runs": [t["prefill_tokens_per_s"] for t in ts]})
    same = {f"{n}/{c}": len(v) == 1 for (n, c), v in ids.items()}
    print(f"kvq run, {n_prompt}-token prompt {a.prompt}, {a.decode} tokens decoded; {cores} cores, load {load}; "
          f"medians of {a.repeat}; two busy loops ran x{spare[0]:.2f} / x{spare[1]:.2f} (before / after)")
    print(f"{'binary':8} {'cache':8} {'threads':>7} {'prefill tok/s':>14} {'x vs 1 thr':>10} {'attention s':>12} "
          f"{'matmul s':>9} {'decode tok/s':>13}")
    for r in rows:
        one = next(x for x in rows if x["binary"] == r["binary"] and x["cache"] == r["cache"] and x["threads"] == 1)
        print(f"{r['binary']:8} {r['cache']:8} {r['threads']:7d} {r['prefill_tok_s']:14.0f} "
              f"{r['prefill_tok_s'] / one['prefill_tok_s']:10.2f} {r['attention_s']:12.2f} {r['matmul_s']:9.2f} "
              f"{r['decode_tok_s']:13.0f}")
    print("greedy ids identical across thread counts: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    out = os.environ.get("KVQ_BENCH_JSON_DIR", os.path.join(a.build, "bench"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_prefill_cpu.json"), "w") as f:
        json.dump({"bench": "prefill_cpu", "prompt": a.prompt, "prompt_tokens": n_prompt, "cores": cores,
                   "load": load, "two_loops_speedup": spare, "repeat": a.repeat, "rows": rows, "ids_identical_across_threads": same}, f, indent=1)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
