#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on f16, the baseline of bench_cuda.

Same shapes and method as bench/bench_cuda.c: one decode step (one query
position) for 32 query heads over 8 KV heads, d = 128, batch 1/8/32,
context 4K..128K; L2 flushed before every launch (256 MB written, then read
back so no dirty line is left to the timed call; --flush write skips the
read, as bench_cuda's KVQ_BENCH_FLUSH=write); CUDA events around the
attention call; 3 warm-ups, median of --reps.

Two formulations, both with the FlashAttention backend forced:
  gqa     : q [B, 32, 1, d], k/v [B, 8, L, d], enable_gqa=True
  grouped : q viewed as [B, 8, 4, d] (the 4 query heads of a KV head as 4
            query rows), k/v [B, 8, L, d] - the same arithmetic, and how
            FlashAttention itself runs GQA decode.
The faster of the two is the baseline. Each is also timed replayed from a
CUDA graph (torch.cuda.CUDAGraph, captured once): the device-side time
without the host's dispatch cost, the counterpart of bench_cuda's
"graph us". Writes JSON to --out.
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def time_fn(fn, flush, reps, read_back):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(reps + 3):
        flush.fill_(i & 0xFF)
        if read_back:
            torch.amax(flush)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(stop))
    return statistics.median(times) * 1e3  # us


def graph_of(fn):
    """fn captured into a CUDA graph (after a warm-up on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.cuda.graph(g):
        fn()
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="131072,65536,32768,16384,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="cuda_sdpa.json")
    ap.add_argument("--flush", choices=["read", "write"], default="read")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_sdpa: no CUDA device, nothing measured")
        return 0
    dev = torch.cuda.get_device_name(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    scale = 1.0 / math.sqrt(D)
    results = []
    print(f"device: {dev}, torch {torch.__version__}, L2 flush: {args.flush}")
    print(f"{'batch':>5} {'context':>7} {'gqa us':>10} {'grouped us':>11} {'best us':>9} {'GB/s':>7} {'graph us':>9}")
    for ctx in [int(c) for c in args.contexts.split(",")]:
        for b in [int(x) for x in args.batches.split(",")]:
            torch.manual_seed(0)
            k = torch.randn(b, HKV, ctx, D, dtype=torch.float16, device="cuda")
            v = torch.randn(b, HKV, ctx, D, dtype=torch.float16, device="cuda")
            q = torch.randn(b, HQ, 1, D, dtype=torch.float16, device="cuda")
            qg = q.view(b, HKV, HQ // HKV, D)
            row = {"batch": b, "context": ctx}
            for name, fn in (
                ("gqa", lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)),
                ("grouped", lambda: F.scaled_dot_product_attention(qg, k, v, scale=scale)),
            ):
                try:
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        fn()
                        torch.cuda.synchronize()
                        row[name + "_us"] = time_fn(fn, flush, args.reps, args.flush == "read")
                    g = graph_of(fn)
                    row[name + "_graph_us"] = time_fn(g.replay, flush, args.reps, args.flush == "read")
                    del g
                except Exception as e:  # a backend refusing a shape is a result too
                    row.setdefault(name + "_us", None)
                    row[name + "_graph_us"] = None
                    row[name + "_error"] = str(e).splitlines()[0][:200]
            # check both formulations compute the same thing
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                try:
                    a = F.scaled_dot_product_attention(qg, k, v, scale=scale).reshape(b, HQ, D)
                    ref = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True).reshape(b, HQ, D)
                    row["max_abs_diff"] = float((a.float() - ref.float()).abs().max())
                except Exception:
                    pass
            ok = [row[n + "_us"] for n in ("gqa", "grouped") if row.get(n + "_us")]
            best = min(ok) if ok else None
            row["us"] = best
            okg = [row[n + "_graph_us"] for n in ("gqa", "grouped") if row.get(n + "_graph_us")]
            row["graph_us"] = min(okg) if okg else None
            row["bytes"] = 2 * b * HKV * ctx * D * 2
            row["gbps"] = row["bytes"] / (best * 1e-6) / 1e9 if best else None
            results.append(row)
            fmt = lambda x: f"{x:.1f}" if x else "-"
            print(f"{b:5d} {ctx:7d} {fmt(row['gqa_us']):>10} {fmt(row['grouped_us']):>11} {fmt(best):>9} "
                  f"{row['gbps'] or 0:7.0f} {fmt(row['graph_us']):>9}")
            del k, v, q, qg
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"benchmark": "cuda_sdpa", "device": dev, "torch": torch.__version__, "flush": args.flush,
                   "results": results}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
