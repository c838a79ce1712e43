#!/usr/bin/env python3
"""transformers decode on the Llama-3.1-8B shape: DynamicCache (bf16, SDPA)
against KVQCache (tq3j/tq3 pages, the fused kvq kernel), eager, and the
torch.compile path of KVQCache.

    python3 python/bench_hf.py [--ctx 32768,131072] [--layers 32] [--steps 16]
                               [--batch 1] [--k tq3j --v tq3] [--no-compile]
                               [--deadline-s 330] --json FILE

The model is bench/hf_llama_shape.py's random-weight bf16 checkpoint, built
in GPU memory (nothing written or downloaded). For each context and cache: a
random prompt of N tokens is prefilled in one forward (logits of the last
position only; KVQCache: SDPA over the prompt, then encoded), then the median
of --steps greedy decode steps after 3 warm-ups is timed, as
hf_llama_shape.py bench does for DynamicCache. Memory: torch's peak
(max_memory_allocated) plus, for KVQCache, its page pools, which libkvq
allocates outside torch's allocator: peak_gib over prefill and decode,
decode_peak_gib over the decode steps alone (weights + cache + step
temporaries); kv_gib is what the cache holds after the prefill
(DynamicCache: its K/V tensors; KVQCache: pages in use).
compile: KVQCache's decode step under torch.compile (default mode, not
fullgraph) at the first context, after the eager runs: the time of the
first two (compiling) steps, then the step time, and how many graphs and
graph breaks dynamo made. layer: one layer's decode attention alone at each
context (kvq decode_step vs SDPA on a bf16 cache), device and host time per
call, so the model's own overhead can be told from the kernel's. Prints one JSON line per measurement and a
table at the end; --deadline-s skips what would not finish in time.
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import kvq_torch  # noqa: E402
from kvq_torch import KVQCache  # noqa: E402

T0 = time.perf_counter()


def elapsed():
    return time.perf_counter() - T0


def kv_bytes_dynamic(cache):
    n = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if torch.is_tensor(t):
                n += t.numel() * t.element_size()
    return n


def step_fn(model, cache):
    def step(tok):
        o = model(tok, past_key_values=cache, use_cache=True)
        return o.logits[:, -1].argmax(-1, keepdim=True)
    return step


def time_steps(step, tok, n):
    times, toks = [], []
    for s in range(n + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            tok = step(tok)
        toks.append(tok[0, 0].item())  # the host waits for the token, as generation does
        times.append(time.perf_counter() - t0)
    t = sorted(times[3:])
    return 1e3 * t[len(t) // 2], tok, toks


def run_one(model, kind, B, N, steps, a, compile_step=False):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device="cuda").manual_seed(N)
    ids = torch.randint(0, model.config.vocab_size, (B, N), generator=g, device="cuda")
    r = {"cache": kind, "batch": B, "ctx": N}
    if kind == "dynamic":
        from transformers import DynamicCache
        kvq_torch.use_kvq(model, "sdpa")
        cache = DynamicCache()
    else:
        kvq_torch.use_kvq(model, "kvq")
        cache = KVQCache(model.config, k=a.k, v=a.v, max_cache_len=N + steps + 64)
        r["types"] = f"{a.k}/{a.v}"
    try:
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            r["prefill_s"] = time.perf_counter() - t0
        tok = o.logits[:, -1].argmax(-1, keepdim=True)
        del o
        kv = kv_bytes_dynamic(cache) if kind == "dynamic" else cache.kv_bytes()
        if kind == "dynamic" and kv == 0:  # a DynamicLayer without .keys/.values: count what it must hold
            c = model.config
            kv = 2 * c.num_hidden_layers * B * c.num_key_value_heads * N * c.head_dim * 2
            r["kv_counted"] = "from the config (bf16 K and V)"
        r["kv_gib"] = kv / 2**30
        r["torch_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30  # the prefill's peak
        torch.cuda.reset_peak_memory_stats()
        ms, tok, toks = time_steps(step_fn(model, cache), tok, steps)
        r.update(ms_per_step=ms, tok_s=B * 1e3 / ms, tokens=toks)
        r["kvq_pool_gib"] = cache.pool_bytes() / 2**30 if kind == "kvq" else 0.0
        r["decode_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 + r["kvq_pool_gib"]
        r["peak_gib"] = max(r["torch_peak_gib"], torch.cuda.max_memory_allocated() / 2**30) + r["kvq_pool_gib"]
        if compile_step:
            r["compile"] = run_compile(model, cache, tok, steps)
    except torch.OutOfMemoryError:
        r["error"] = "out of memory"
    finally:
        if kind == "kvq":
            cache.close()
        kvq_torch.use_kvq(model, "sdpa")
        del cache
    return r


def run_compile(model, cache, tok, steps):
    """KVQCache's decode step through torch.compile: does it run, what it costs."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    c = {}
    try:
        step = torch.compile(step_fn(model, cache))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            tok = step(tok)
            tok = step(tok)
        torch.cuda.synchronize()
        c["first_two_steps_s"] = time.perf_counter() - t0
        ms, tok, _ = time_steps(step, tok, steps)
        c.update(runs=True, ms_per_step=ms, tok_s=tok.shape[0] * 1e3 / ms)
    except Exception as e:  # noqa: BLE001 - the point is to report whether it runs
        c.update(runs=False, error=f"{type(e).__name__}: {str(e)[:400]}")
    c["unique_graphs"] = int(counters["stats"].get("unique_graphs", 0))
    c["graph_breaks"] = int(sum(counters["graph_break"].values()))
    c["recompiles"] = int(counters["recompiles"].get("total", 0)) if "recompiles" in counters else None
    return c


def layer_bench(N, a, iters=50):
    """One layer's decode attention at context N, outside the model: KVQ's
    decode_step (bf16 in: conversion, encode of the new token, fused
    attention, bf16 out) against SDPA over a bf16 cache (GQA 32/8, d 128).
    Device time from CUDA events; host time per call without synchronising
    (what eager decoding pays per layer on the CPU)."""
    from kvq_torch import ops
    from kvq_torch.device_cache import DeviceCache
    import torch.nn.functional as F
    H, G, D = 8, 4, 128
    g = torch.Generator(device="cuda").manual_seed(N)
    dc = DeviceCache(H, D, N + iters + 16, 1, a.k, a.v, recent_f16=True)
    h, anchor = ops.register(dc), torch.zeros(1, dtype=torch.int64)
    for t0 in range(0, N, 16384):
        n = min(16384, N - t0)
        kk = torch.randn(n, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
        torch.ops.kvq.append(h, 0, kk, kk, anchor)
    k1 = torch.randn(1, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, H * G, D, generator=g, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(1, H, N, D, generator=g, device="cuda", dtype=torch.bfloat16)
    qs = q[:, :, None, :]

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        host = (time.perf_counter() - t0) / iters
        torch.cuda.synchronize()
        return 1e3 * e0.elapsed_time(e1) / iters, 1e6 * host

    kvq_us, kvq_host = timed(lambda: torch.ops.kvq.decode_step(h, k1, k1, q, D ** -0.5, anchor))
    sdpa_us, sdpa_host = timed(lambda: F.scaled_dot_product_attention(qs, kc, kc, enable_gqa=True))
    ops.unregister(h)
    del kc
    torch.cuda.empty_cache()
    return {"ctx": N, "kvq_decode_step_us": kvq_us, "kvq_host_us": kvq_host, "sdpa_us": sdpa_us,
            "sdpa_host_us": sdpa_host, "note": "device us per layer call (events over %d calls); host us per call "
            "without sync" % iters}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ctx", default="32768,131072")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--k", default="tq3j")
    p.add_argument("--v", default="tq3")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--deadline-s", type=float, default=330.0)
    p.add_argument("--json")
    a = p.parse_args()
    import hf_llama_shape
    import transformers
    model = hf_llama_shape.random_model("llama31-8b", a.layers, seed=0)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "layers": a.layers, "steps": a.steps, "results": []}
    print(f"bench_hf: model of {a.layers} layers ready after {elapsed():.0f} s", flush=True)
    ctxs = [int(x) for x in a.ctx.split(",")]
    out["layer"] = []
    for N in ctxs:  # one layer alone first: seconds, and it separates the kernel from the model's overhead
        r = layer_bench(N, a)
        print(f"| layer {N} | kvq decode_step {r['kvq_decode_step_us']:.1f} us (host {r['kvq_host_us']:.1f} us) "
              f"| SDPA bf16 {r['sdpa_us']:.1f} us (host {r['sdpa_host_us']:.1f} us) |", flush=True)
        out["layer"].append(r)

    def save():  # after every measurement: a run cut short by a timeout keeps what it measured
        out["seconds"] = elapsed()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    for N in ctxs:
        for kind in ("dynamic", "kvq"):
            # a 128K prefill takes ~20 s per cache on an H100; keep a margin for the rest
            if elapsed() > a.deadline_s - (60 if N > 65536 else 20):
                r = {"cache": kind, "batch": a.batch, "ctx": N, "error": "skipped: deadline"}
            else:
                r = run_one(model, kind, a.batch, N, a.steps, a)
            print(json.dumps(r), flush=True)
            out["results"].append(r)
            save()
    # the two caches' greedy tokens after the same prompt (informational: tq3 pages change logits slightly)
    table = []
    for N in ctxs:
        d = next((r for r in out["results"] if r["ctx"] == N and r["cache"] == "dynamic"), {})
        q = next((r for r in out["results"] if r["ctx"] == N and r["cache"] == "kvq"), {})
        if "tok_s" in d and "tok_s" in q:
            row = {"ctx": N, "dynamic_tok_s": d["tok_s"], "kvq_tok_s": q["tok_s"],
                   "speedup": q["tok_s"] / d["tok_s"], "dynamic_kv_gib": d["kv_gib"], "kvq_kv_gib": q["kv_gib"],
                   "kv_ratio": d["kv_gib"] / max(q["kv_gib"], 1e-12), "dynamic_peak_gib": d["peak_gib"],
                   "kvq_peak_gib": q["peak_gib"], "dynamic_decode_peak_gib": d["decode_peak_gib"],
                   "kvq_decode_peak_gib": q["decode_peak_gib"],
                   "same_greedy_tokens": sum(x == y for x, y in zip(d["tokens"], q["tokens"]))}
            table.append(row)
    out["summary"] = table
    save()
    print("| ctx | DynamicCache tok/s | KVQCache tok/s | speedup | KV GiB dyn / kvq | ratio | peak GiB dyn / kvq "
          "| decode peak GiB dyn / kvq |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['ctx']} | {r['dynamic_tok_s']:.2f} | {r['kvq_tok_s']:.2f} | {r['speedup']:.2f}x | "
              f"{r['dynamic_kv_gib']:.2f} / {r['kvq_kv_gib']:.2f} | {r['kv_ratio']:.2f}x | "
              f"{r['dynamic_peak_gib']:.1f} / {r['kvq_peak_gib']:.1f} | "
              f"{r['dynamic_decode_peak_gib']:.1f} / {r['kvq_decode_peak_gib']:.1f} |")
    # the compile path last, so a slow compile never costs the eager measurements
    if not a.no_compile:
        if elapsed() < a.deadline_s - 120:
            print(f"bench_hf: torch.compile path at {ctxs[0]} ({elapsed():.0f} s elapsed)", flush=True)
            r = run_one(model, "kvq", a.batch, ctxs[0], a.steps, a, compile_step=True)
            r["cache"] = "kvq+compile"
        else:
            r = {"cache": "kvq+compile", "ctx": ctxs[0], "compile": {"runs": None, "error": "skipped: deadline"}}
        print(json.dumps(r), flush=True)
        out["results"].append(r)
        save()
    comp = [r["compile"] for r in out["results"] if "compile" in r]
    print("torch.compile path:", json.dumps(comp[0]) if comp else "not run", flush=True)


if __name__ == "__main__":
    main()
