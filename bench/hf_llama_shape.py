#!/usr/bin/env python3
"""Llama-3.1-8B-shaped checkpoints with random bf16 weights, a transformers
reference for them, and transformers' own decode/prefill speed on them.

    hf_llama_shape.py make  --out DIR [--shape llama31-8b|llama32-1b] [--layers N] [--seed 0] [--ref]
    hf_llama_shape.py bench --model DIR [--ctx 4096,32768,131072] [--batch 1] [--json FILE]

make: Llama-3.1-8B's config (hidden 4096, 32/8 heads, head_dim 128, ffn
14336, vocab 128256, rope_theta 500000 with llama3 scaling), or with
--shape llama32-1b Llama-3.2-1B's (hidden 2048, 16 layers, 32/8 heads,
head_dim 64, ffn 8192, tied embeddings), `--layers` layers (default: the
shape's), weights N(0, 0.02) generated on the GPU in bf16, norm weights
1 + N(0, 0.1) so they are exercised; saved with save_pretrained (bf16
safetensors). --ref also writes DIR/reference.safetensors: 64 prompt ids
and the logits at the last 4 positions computed two ways over the same bf16
weights: in float32 (the model cast to float32: the exact reference) and in
bf16 (what a transformers user runs), plus 8 greedy ids of the float32 model.

bench: transformers with DynamicCache and SDPA in bf16 on DIR: prefill time
of a random prompt of each context, then the median time of 16 greedy
decode steps after it, and the peak device memory. Runs on the device
machine (torch 2.11, transformers 5.17); nothing is downloaded.
"""
import argparse
import json
import time

import torch


# The published configs' shapes: (hidden, ffn, layers, heads, KV heads, head
# dim, llama3 RoPE factor, tied embeddings).
SHAPES = {
    "llama31-8b": (4096, 14336, 32, 32, 8, 128, 8.0, False),
    "llama32-1b": (2048, 8192, 16, 32, 8, 64, 32.0, True),
}


def llama_config(shape, layers=None, vocab=128256):
    from transformers import LlamaConfig
    hidden, ffn, n_layers, heads, kv, d, factor, tied = SHAPES[shape]
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers or n_layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=d, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        tie_word_embeddings=tied, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16")


def random_model(shape, layers, seed):
    from transformers import LlamaForCausalLM
    cfg = llama_config(shape, layers)
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device="cuda"))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g, device="cuda"))
    model.eval()
    return model


def cmd_make(a):
    model = random_model(a.shape, a.layers, a.seed)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="5GB")
    if not a.ref:
        return
    from safetensors.torch import save_file
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=g, device="cuda")
    with torch.no_grad():
        bf = model(ids).logits[0, -4:].float()
        model32 = model.float()
        f32 = model32(ids).logits[0, -4:].float()
        greedy = model32.generate(ids, max_new_tokens=8, do_sample=False)[0, 64:]
    save_file({"ids": ids[0].to(torch.int32).cpu().contiguous(), "logits_f32": f32.cpu().contiguous(),
               "logits_bf16": bf.cpu().contiguous(), "greedy": greedy.to(torch.int32).cpu().contiguous()},
              f"{a.out}/reference.safetensors")
    err = ((bf - f32).abs().max() / f32.abs().max()).item()
    print(f"reference: {a.out}/reference.safetensors; transformers bf16 vs float32 logits: {err:.3g} x max|logit|")


def cmd_bench(a):
    from transformers import AutoModelForCausalLM, DynamicCache
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                 device_map="cuda")
    model.eval()
    V = model.config.vocab_size
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    import transformers
    out["transformers"] = transformers.__version__
    for B in [int(x) for x in a.batch.split(",")]:
        for N in [int(x) for x in a.ctx.split(",")]:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            r = {"batch": B, "ctx": N}
            ids = cache = o = None
            try:
                with torch.no_grad():
                    ids = torch.randint(0, V, (B, N), device="cuda")
                    cache = DynamicCache()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    # one forward over the prompt, logits of the last position only
                    o = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    torch.cuda.synchronize()
                    r["prefill_s"] = time.perf_counter() - t0
                    tok = o.logits[:, -1].argmax(-1, keepdim=True)
                    times = []
                    for s in range(19):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        o = model(tok, past_key_values=cache, use_cache=True)
                        tok = o.logits[:, -1].argmax(-1, keepdim=True)
                        tok.cpu()
                        times.append(time.perf_counter() - t0)
                    times = sorted(times[3:])
                    ms = 1e3 * times[len(times) // 2]
                    r.update({"ms_per_step": ms, "tok_s": B * 1e3 / ms,
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
            except torch.OutOfMemoryError:
                r["error"] = "out of memory"
            print(json.dumps(r), flush=True)
            out["results"].append(r)
            del ids, cache, o
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--shape", choices=sorted(SHAPES), default="llama31-8b")
    m.add_argument("--layers", type=int, help="default: the shape's")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--ref", action="store_true")
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--ctx", default="4096,32768,131072")
    b.add_argument("--batch", default="1")
    b.add_argument("--json")
    a = p.parse_args()
    cmd_make(a) if a.cmd == "make" else cmd_bench(a)


if __name__ == "__main__":
    main()
