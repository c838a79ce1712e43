#!/usr/bin/env python3
"""PyTorch's SDPA on bench_prefill_cuda's chunk: the baseline of the prefill kernel.

One chunk of 2048 query positions (32 query heads, 8 KV heads, d = 128 or
--dims)
attending causally to the past and to itself (the causal mask aligned at the
lower right: position i of the chunk sees past + i + 1 keys), bf16, contexts
2K .. 128K as bench_prefill_cuda. Timed with CUDA events, 2 warm-ups, median
of --reps; TFLOP/s counts 4 d flops per (query head, attended key) pair.
  mask   : attn_mask=causal_lower_right(2048, L), enable_gqa=True (the
           backend PyTorch picks for it)
  flash  : the FlashAttention backend forced, is_causal=False over all L
           keys (no mask: an upper bound on the work, timed for the rate)
Writes JSON to --out.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HQ, HKV, CHUNK = 32, 8, 2048
CTX = [2048, 8192, 32768, 129024]


def time_fn(fn, reps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for i in range(reps + 2):
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        if i >= 2:
            ts.append(start.elapsed_time(stop))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dims", default="128", help="head dims, comma-separated")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    print(f"{'mode':6} {'d':>4} {'context':>8} {'ms/chunk':>9} {'TFLOP/s':>8}")
    for D, L in [(int(d), L) for d in a.dims.split(",") for L in CTX]:
        q = torch.randn(1, HQ, CHUNK, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HKV, L, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, HKV, L, D, device="cuda", dtype=torch.bfloat16)
        past = L - CHUNK
        pairs = CHUNK * past + CHUNK * (CHUNK + 1) / 2
        mask = causal_lower_right(CHUNK, L)
        runs = {"mask": (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), pairs)}

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        runs["flash"] = (flash, CHUNK * L)
        for name, (fn, pr) in runs.items():
            try:
                ms = time_fn(fn, a.reps)
            except RuntimeError as e:
                print(f"{name:6} {D:4d} {L:8d} failed: {str(e).splitlines()[0]}")
                res["results"].append({"mode": name, "d": D, "context": L, "error": str(e).splitlines()[0]})
                continue
            tf = 4.0 * D * HQ * pr / (ms * 1e-3) / 1e12
            print(f"{name:6} {D:4d} {L:8d} {ms:9.2f} {tf:8.1f}")
            res["results"].append({"mode": name, "d": D, "context": L, "ms_per_chunk": ms, "tflops": tf})
        del q, k, v
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
