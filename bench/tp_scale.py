#!/usr/bin/env python3
"""Tensor-parallel decode with the kvq cache (issue 23): transformers
tp_plan="auto" on the Llama-3.1-8B shape, KVQCache (tq3j/tq3 pages, the fused
kernel) against DynamicCache (bf16, SDPA), one process per GPU.

    python3 bench/hf_llama_shape.py make --layers 32 --out CKPT     # once, ~16 GB
    torchrun --nproc-per-node N bench/tp_scale.py --model CKPT --json OUT.json
    python3 bench/tp_scale.py --table OUT1.json OUT2.json ...       # the table

Each rank holds its own KV heads (8 / N): KVQCache is sized from the tensors
it receives, so it needs no change under TP. N = 1 loads with
device_map="cuda" (transformers 5.17 leaves a world-size-1 tp_plan model on
the CPU).

Decode is measured at each context without the prefill: every layer's cache
is filled with the same seeded random K/V (the full 8 heads drawn, each rank
keeps its slice, so all N see one cache), as bench_decoder_cuda does with
kvq_batch_fill. Then the median of --steps greedy steps after 3 warm-ups
(the host reads each token, as generation does). Per run: tok/s, peak
memory per GPU (torch's peak plus kvq's page pools, which libkvq allocates
outside torch), KV bytes per token per GPU, the greedy tokens (rank 0), and
the longest context that would fit per GPU: (GPU memory - weights - the
measured decode temporaries) / KV bytes per token, at that batch.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def fill(cache, kind, model, B, N, seed, rank, world):
    """Every layer gets the same random K/V whatever N: drawn for all KV heads
    from one seed per layer, sliced to this rank's heads (colwise k/v_proj
    shards are contiguous head blocks)."""
    import torch
    c = model.config
    H, D = c.num_key_value_heads, c.head_dim
    h0, h1 = rank * H // world, (rank + 1) * H // world
    chunk = N if kind == "dynamic" else 8192  # DynamicCache would re-concatenate per chunk
    for layer in range(c.num_hidden_layers):
        g = torch.Generator(device="cuda").manual_seed(seed * 1000 + layer)
        for t0 in range(0, N, chunk):
            t = min(chunk, N - t0)
            # [B, H, t, D] as transformers passes them; keys with a spread like real ones
            k = torch.randn(B, H, t, D, generator=g, device="cuda", dtype=torch.bfloat16)[:, h0:h1]
            v = torch.randn(B, H, t, D, generator=g, device="cuda", dtype=torch.bfloat16)[:, h0:h1]
            if kind == "dynamic":
                cache.update(k.contiguous(), v.contiguous(), layer)
            else:
                lay = cache._layer(layer)
                if not lay.is_initialized:
                    lay.lazy_initialization(k)
                for b in range(B):
                    torch.ops.kvq.append(lay.handle, b, k[b].transpose(0, 1).contiguous(),
                                         v[b].transpose(0, 1).contiguous(), lay.anchor)
                lay.seen += t
    torch.cuda.synchronize()


def kv_bytes(cache, kind):
    if kind != "dynamic":
        return cache.kv_bytes()
    n = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                n += t.numel() * t.element_size()
    return n


def run_one(model, kind, B, N, a, rank, world):
    import torch
    import kvq_torch
    from kvq_torch import KVQCache
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    r = {"cache": kind if kind == "dynamic" else f"{a.k}/{a.v}", "batch": B, "ctx": N, "world": world}
    if kind == "dynamic":
        from transformers import DynamicCache
        kvq_torch.use_kvq(model, "sdpa")
        cache = DynamicCache()
    else:
        kvq_torch.use_kvq(model, "kvq")
        cache = KVQCache(model.config, k=a.k, v=a.v, max_cache_len=N + a.steps + 64)
    try:
        t0 = time.perf_counter()
        fill(cache, kind, model, B, N, a.seed, rank, world)
        r["fill_s"] = time.perf_counter() - t0
        kv = kv_bytes(cache, kind)
        r["kv_gib_per_gpu"] = kv / 2**30
        r["kv_bytes_per_token_per_gpu"] = kv / (B * N)
        g = torch.Generator(device="cuda").manual_seed(a.seed)
        tok = torch.randint(0, model.config.vocab_size, (B, 1), generator=g, device="cuda")
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times, toks, tops = [], [], []
        with torch.no_grad():
            for s in range(a.steps + 3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = model(tok, past_key_values=cache, use_cache=True)
                tok = o.logits[:, -1].argmax(-1, keepdim=True)
                toks.append(tok[:, 0].tolist())  # the host waits for the tokens
                times.append(time.perf_counter() - t0)
                # row 0's top logits: how far apart the runs' logits are, and
                # how small a margin a greedy choice of random weights has
                top = o.logits[0, -1].float().topk(16)
                tops.append([top.indices.tolist(), top.values.tolist()])
                del o
        t = sorted(times[3:])
        ms = 1e3 * t[len(t) // 2]
        pool = cache.pool_bytes() if kind != "dynamic" else 0
        peak = torch.cuda.max_memory_allocated()
        r.update(ms_per_step=ms, tok_s=B * 1e3 / ms, tokens=toks, top16_row0=tops)
        r["peak_gib_per_gpu"] = (peak + pool) / 2**30
        r["decode_temp_gib"] = (peak - base) / 2**30
    except torch.OutOfMemoryError:
        r["error"] = "out of memory"
    finally:
        if kind != "dynamic":
            cache.close()
        kvq_torch.use_kvq(model, "sdpa")
        del cache
    return r


def main_run(a):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import kvq_torch  # noqa: F401  (registers attn_implementation "kvq")
    from transformers import AutoModelForCausalLM
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    t0 = time.perf_counter()
    if world > 1:
        dist.init_process_group("nccl")
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, tp_plan="auto",
                                                     attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda",
                                                     attn_implementation="sdpa")
    model.eval()
    weights = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    out = {"world": world, "device": torch.cuda.get_device_name(), "gpu_gib": total / 2**30,
           "weights_gib_per_gpu": weights / 2**30, "load_s": time.perf_counter() - t0,
           "kv_heads_per_gpu": model.config.num_key_value_heads // world, "results": []}
    if rank == 0:
        print(f"tp_scale: world {world}, {out['device']}, weights {weights / 2**30:.2f} GiB per GPU, "
              f"loaded in {out['load_s']:.0f} s", flush=True)
    deadline = time.perf_counter() + a.deadline_s
    c = model.config
    for N in [int(x) for x in a.ctx.split(",")]:
        for B in [int(x) for x in a.batch.split(",")]:
            for kind in ("dynamic", "kvq"):
                # rank 0 decides for all: a rank that ran out of memory or time
                # alone would leave the others waiting in a collective
                why = None
                if time.perf_counter() > deadline:
                    why = "skipped: deadline"
                elif kind == "dynamic":
                    kv = 2 * c.num_hidden_layers * (c.num_key_value_heads // world) * c.head_dim * 2 * B * N
                    if weights + kv + 4 * 2**30 > total:
                        why = f"does not fit: {kv / 2**30:.0f} GiB of bf16 K/V per GPU"
                if world > 1:
                    box = [why]
                    dist.broadcast_object_list(box, src=0)
                    why = box[0]
                if why:
                    r = {"cache": kind if kind == "dynamic" else f"{a.k}/{a.v}", "batch": B, "ctx": N,
                         "world": world, "error": why}
                else:
                    r = run_one(model, kind, B, N, a, rank, world)
                if "kv_bytes_per_token_per_gpu" in r and "decode_temp_gib" in r:
                    free = total - weights - r["decode_temp_gib"] * 2**30 - a.reserve_gib * 2**30
                    r["max_ctx_fit"] = int(free / (B * r["kv_bytes_per_token_per_gpu"]))
                if rank == 0:
                    print(json.dumps({k: v for k, v in r.items() if k not in ("tokens", "top16_row0")}), flush=True)
                out["results"].append(r)
                if rank == 0 and a.json:
                    with open(a.json, "w") as f:
                        json.dump(out, f, indent=1)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def agreement(a_toks, b_toks):
    """Steps whose greedy tokens (every batch row) equal before the first difference."""
    n = 0
    for x, y in zip(a_toks, b_toks):
        if x != y:
            break
        n += 1
    return n


def logit_gap(ref, run):
    """Step 0, row 0: the largest difference of the top-16 logits both runs
    share, over the largest logit, and the reference's top-2 margin (same unit)."""
    if not ref or not run:
        return None, None
    (i0, v0), (i1, v1) = ref[0], run[0]
    m = {i: v for i, v in zip(i1, v1)}
    scale = max(abs(x) for x in v0) or 1.0
    diff = max((abs(v - m[i]) for i, v in zip(i0, v0) if i in m), default=float("nan"))
    return diff / scale, (v0[0] - v0[1]) / scale


def main_table(files):
    runs = [json.load(open(f)) for f in files]
    runs.sort(key=lambda r: r["world"])
    key_of = lambda r: (r["cache"], r["batch"], r["ctx"])  # noqa: E731
    ref = {key_of(r): r for r in runs[0]["results"]} if runs else {}
    rows = ["| GPUs | cache | batch | ctx | tok/s | peak GiB per GPU | KV GiB per GPU | longest ctx that fits "
            "| greedy = N=%d | step-0 logits vs N=%d (top-2 margin) |" % ((runs[0]["world"],) * 2 if runs else (1, 1)),
            "|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for run in runs:
        for r in run["results"]:
            key = key_of(r)
            if "error" in r:
                rows.append(f"| {run['world']} | {r['cache']} | {r['batch']} | {r['ctx']} | {r['error']} | | | | |")
                continue
            r0 = ref.get(key) or {}
            t0 = r0.get("tokens")
            agree = "-" if not t0 else f"{agreement(t0, r['tokens'])}/{len(r['tokens'])} steps"
            gap, margin = logit_gap(r0.get("top16_row0"), r.get("top16_row0"))
            gaps = "-" if gap is None else f"{gap:.2g} ({margin:.2g})"
            rows.append(f"| {run['world']} | {r['cache']} | {r['batch']} | {r['ctx']} | {r['tok_s']:.1f} | "
                        f"{r['peak_gib_per_gpu']:.1f} | {r['kv_gib_per_gpu']:.2f} | {r.get('max_ctx_fit', 0):,} | "
                        f"{agree} | {gaps} |")
    head = [f"{r['world']} x {r['device']}: weights {r['weights_gib_per_gpu']:.1f} GiB per GPU, "
            f"{r['kv_heads_per_gpu']} KV heads per GPU" for r in runs]
    print("\n".join(head + [""] + rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="the checkpoint folder (bench/hf_llama_shape.py make)")
    p.add_argument("--ctx", default="32768,131072")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--k", default="tq3j")
    p.add_argument("--v", default="tq3")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reserve-gib", type=float, default=1.0, help="kept free in the fit estimate")
    p.add_argument("--deadline-s", type=float, default=400)
    p.add_argument("--json")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these runs and exit")
    a = p.parse_args()
    if a.table:
        return main_table(a.table)
    if not a.model:
        p.error("--model is required")
    return main_run(a)


if __name__ == "__main__":
    sys.exit(main())
