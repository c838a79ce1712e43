#!/usr/bin/env python3
"""make_refs.py - tiny random-weight checkpoints of the model families kvq
decodes, with transformers' float32 logits and greedy ids as the reference.

Run on a machine with torch + transformers (no internet needed):

    python3 tests/models/make_refs.py --out tests/models

For each family it writes OUT/FAMILY/:
  config.json, model.safetensors   the checkpoint (bf16 weights, as real ones)
  reference.safetensors            ids [T] int32 (the prompt), logits [T][vocab]
                                   float32 (every prompt position), greedy [N] int32
                                   (greedy continuation with the KV cache, as generate)
  reference.json                   family, prompt length, what the case exercises,
                                   transformers / torch versions

Weights are random (seeded), saved as bf16, and the reference runs the saved
checkpoint reloaded in float32 (eager attention, CPU), so the C decoder and
transformers compute over the same bf16 weights. Norm weights and biases are
perturbed away from their initial values so that they are exercised. Prompts
are longer than the original context where the RoPE scaling depends on it
(dynamic, longrope), so that the scaled frequencies are used.

--f16-cache adds, to every fixture already in OUT, the reference of an f16
KV cache: the same float32 forward, with every key and value the cache keeps
rounded to f16 as it is stored (an f16-rounding DynamicCache), so the prompt
logits ("logits_f16kv") and the greedy continuation ("greedy_f16kv") are
what a float32 model with an f16 cache computes. The other tensors are kept
byte for byte.

Self-checks (the script exits non-zero if one fails): the reloaded config
keeps the RoPE type; the reloaded checkpoint gives the logits that were
saved; the greedy continuation equals the argmax of a full (cache-free)
forward wherever the RoPE does not depend on the length; each greedy step's
top-1 margin is large enough that float32 rounding cannot flip it (else the
next seed is tried); all fixtures together stay under 8 MB.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

VOCAB = 256
N_GREEDY = 16
MIN_MARGIN = 1e-2  # relative to max|logit|: greedy must not hinge on rounding, f16 cache included


def base(**kw):
    c = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
             max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=None, pad_token_id=None, initializer_range=0.08)
    c.update(kw)
    return c


# name -> (config class, model class, config kwargs, prompt length, what it exercises)
FAMILIES = {
    "llama_llama3": ("LlamaConfig", "LlamaForCausalLM", base(
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        40, "Llama 3.1 RoPE scaling (high, smoothed and low frequency bands all present)"),
    "llama_linear": ("LlamaConfig", "LlamaForCausalLM", base(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, attention_bias=True),
        40, "linear RoPE scaling; Llama attention_bias (q/k/v/o biases)"),
    "llama_dynamic": ("LlamaConfig", "LlamaForCausalLM", base(
        max_position_embeddings=32, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}),
        48, "dynamic NTK RoPE past max_position_embeddings (prompt 48 > 32)"),
    "qwen2_yarn": ("Qwen2Config", "Qwen2ForCausalLM", base(
        max_position_embeddings=128, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                      "original_max_position_embeddings": 32}),
        40, "YaRN RoPE (ramp, attention factor); Qwen2 q/k/v biases"),
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", base(
        hidden_size=128, max_position_embeddings=128, original_max_position_embeddings=32, partial_rotary_factor=0.5,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                         "short_factor": [1.0 + 0.1 * i for i in range(8)],
                         "long_factor": [1.5 + 0.4 * i for i in range(8)]}),
        48, "Phi-3: fused qkv_proj and gate_up_proj, partial rotary (0.5), longrope past the original context"),
    "mistral_window": ("MistralConfig", "MistralForCausalLM", base(sliding_window=8), 40,
                       "Mistral sliding-window attention (window 8; prompt + greedy reach 7x the window)"),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", base(num_hidden_layers=3, use_sliding_window=True,
                                                             sliding_window=8, max_window_layers=1), 40,
                     "Qwen2 with use_sliding_window: layers from max_window_layers on windowed (layer_types)"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", base(
        tie_word_embeddings=True, rms_norm_eps=1e-6, num_hidden_layers=4, sliding_window=8, query_pre_attn_scalar=24,
        hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}),
        40, "Gemma 3 text: (1+w) RMSNorm incl. q/k norms, sandwich norms, GELU-tanh, embedding scale, "
            "query_pre_attn_scalar, sliding/global layers with local and linear-scaled global RoPE"),
    "qwen2_kbias": ("Qwen2Config", "Qwen2ForCausalLM", base(num_hidden_layers=4), 40,
                    "Qwen2 whose first and last layers' k_proj bias has 30x the median norm (the Qwen2/2.5 case "
                    "that breaks 3-bit keys elsewhere: llama.cpp issue 21385)"),
}

LEN_DEPENDENT = {"llama_dynamic", "phi3_longrope"}
KBIAS_RATIO = 30.0


def large_k_bias(model, gen):
    """First and last layers: k_proj bias with KBIAS_RATIO x the median norm of all layers'."""
    layers = model.model.layers
    with torch.no_grad():
        med = torch.stack([l.self_attn.k_proj.bias.norm() for l in layers]).median()
        for l in (layers[0], layers[-1]):
            b = torch.randn(l.self_attn.k_proj.bias.shape, generator=gen)
            l.self_attn.k_proj.bias.copy_(b / b.norm() * med * KBIAS_RATIO)


class FixtureError(Exception):
    """A self-check failed: the family's fixture is not written."""


def perturb(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif "norm" in name:
                p.copy_(1.0 + (torch.rand(p.shape, generator=gen) - 0.5))


def forward_logits(model, ids):
    with torch.no_grad():
        return model(ids[None], use_cache=False).logits[0].float()


def greedy(model, ids, n):
    """Greedy continuation with the KV cache, step by step as generate does."""
    out, margins = [], []
    with torch.no_grad():
        r = model(ids[None], use_cache=True)
        past, logits = r.past_key_values, r.logits[0, -1].float()
        for _ in range(n):
            top = torch.topk(logits, 2).values
            margins.append(float((top[0] - top[1]) / logits.abs().max()))
            tok = int(torch.argmax(logits))
            out.append(tok)
            r = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, logits = r.past_key_values, r.logits[0, -1].float()
    return out, min(margins)


class F16Cache(transformers.DynamicCache):
    """A DynamicCache that keeps keys and values rounded to f16 (as kvq's f16 cache type stores them)."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states.half().float(), value_states.half().float(), layer_idx, *args, **kwargs)


def f16_cache_refs(d, model_cls):
    """Adds logits_f16kv and greedy_f16kv to the fixture in d; returns the f16 logits' distance to the f32 ones."""
    from safetensors.torch import load_file
    path = os.path.join(d, "reference.safetensors")
    have = load_file(path)
    ref = getattr(transformers, model_cls).from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    ids = have["ids"].to(torch.int64)
    with torch.no_grad():
        logits = ref(ids[None], past_key_values=F16Cache(config=ref.config), use_cache=True).logits[0].float()
        out = []
        past = F16Cache(config=ref.config)
        r = ref(ids[None], past_key_values=past, use_cache=True)
        for _ in range(len(have["greedy"])):
            tok = int(torch.argmax(r.logits[0, -1]))
            out.append(tok)
            r = ref(torch.tensor([[tok]]), past_key_values=r.past_key_values, use_cache=True)
    gap = float((logits - have["logits"]).abs().max() / have["logits"].abs().max())
    if not 0 < gap < 1e-2:
        raise FixtureError(f"f16-cache logits differ from the f32 ones by {gap:.3g} x max|logit|")
    have["logits_f16kv"] = logits.contiguous()
    have["greedy_f16kv"] = torch.tensor(out, dtype=torch.int32)
    save_file(have, path)
    again = load_file(path)
    if any(not torch.equal(again[k], have[k]) for k in have):
        raise FixtureError("rewriting reference.safetensors changed a tensor")
    meta_path = os.path.join(d, "reference.json")
    meta = json.load(open(meta_path))
    meta["f16_cache"] = ("logits_f16kv, greedy_f16kv: float32 compute with every cached key and value rounded to "
                         "f16 as stored (an f16-rounding DynamicCache)")
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    return gap, out == [int(t) for t in have["greedy"]]


def build(name, out_dir, seed):
    cfg_cls, model_cls, kw, T, what = FAMILIES[name]
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    perturb(model, gen)
    if name == "qwen2_kbias":
        large_k_bias(model, gen)
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    # The reference: the saved bf16 checkpoint, reloaded, computed in float32.
    ref = getattr(transformers, model_cls).from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    saved = json.load(open(os.path.join(d, "config.json")))
    rp = saved.get("rope_parameters") or saved.get("rope_scaling") or {}
    rp = rp.get("full_attention", rp)  # keyed by layer type (Gemma 3)
    kp = kw.get("rope_parameters", {})
    want = kp.get("full_attention", kp).get("rope_type", "default")
    if rp.get("rope_type", rp.get("type", "default")) != want:
        raise FixtureError(f"config.json lost the rope type {want}: {rp}")
    ids = torch.cat([torch.tensor([1]), torch.randint(3, VOCAB, (T - 1,), generator=gen)])
    logits = forward_logits(ref, ids)
    toks, margin = greedy(ref, ids, N_GREEDY)
    if margin < MIN_MARGIN:
        return None, margin
    if name not in LEN_DEPENDENT:
        # a full forward over prompt + continuation must agree with the cached steps
        full = forward_logits(ref, torch.cat([ids, torch.tensor(toks[:-1])]))
        if [int(t) for t in full[T - 1:].argmax(-1)] != toks:
            raise FixtureError("cached greedy steps disagree with a full forward")
    again = forward_logits(getattr(transformers, model_cls).from_pretrained(d, dtype=torch.float32,
                                                                            attn_implementation="eager").eval(), ids)
    if not torch.equal(again, logits):
        raise FixtureError("reloading the checkpoint changed the logits")
    save_file({"ids": ids.to(torch.int32).contiguous(), "logits": logits.contiguous(),
               "greedy": torch.tensor(toks, dtype=torch.int32)}, os.path.join(d, "reference.safetensors"))
    meta = {"family": name, "model_type": saved["model_type"], "prompt_tokens": T, "greedy_tokens": N_GREEDY,
            "exercises": what, "seed": seed, "min_greedy_margin": margin, "torch": torch.__version__,
            "transformers": transformers.__version__, "compute": "float32, eager attention, CPU, bf16 weights"}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return d, margin


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the FAMILY/ fixture directories into")
    ap.add_argument("--only", nargs="*", default=None, help="families to build (default: all)")
    ap.add_argument("--f16-cache", action="store_true",
                    help="add the f16-cache reference to the fixtures already in --out (nothing else changes)")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if a.f16_cache:
        for name in a.only or FAMILIES:
            gap, same = f16_cache_refs(os.path.join(a.out, name), FAMILIES[name][1])
            print(f"{name}: f16 cache moves the logits by {gap:.3g} x max|logit|; greedy "
                  f"{'as with f32' if same else 'differs from f32'}", flush=True)
        return
    os.makedirs(a.out, exist_ok=True)
    total, failed = 0, []
    for name in a.only or FAMILIES:
        try:
            for seed in range(1, 30):
                d, margin = build(name, a.out, seed)
                if d:
                    break
                print(f"{name}: seed {seed}: greedy margin {margin:.2e} too small, next seed", flush=True)
            else:
                raise FixtureError("no seed gives a safe greedy margin")
        except Exception as e:  # one family's failure (a self-check, an API change) leaves the others
            shutil.rmtree(os.path.join(a.out, name), ignore_errors=True)
            failed.append(name)
            print(f"{name}: FAILED, nothing written: {type(e).__name__}: {e}", flush=True)
            continue
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        total += size
        print(f"{name}: {d} ({size / 1e6:.2f} MB, seed {seed}, margin {margin:.2e})", flush=True)
    if total > 8e6:
        sys.exit(f"fixtures total {total / 1e6:.1f} MB, over the 8 MB budget")
    if failed:
        sys.exit(f"{len(failed)} families failed ({', '.join(failed)}); {total / 1e6:.2f} MB of the others in {a.out}")
    print(f"ok: {total / 1e6:.2f} MB in {a.out}")


if __name__ == "__main__":
    main()
