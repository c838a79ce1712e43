"""kvq_torch on a GPU with torch and transformers (the device machine).

Skips as a whole, with one line, without torch >= 2.4, transformers, a CUDA
device or a CUDA-built libkvq.so. Environment:
  KVQ_LIB   the libkvq.so to load (else kvq_torch/lib/ or build/lib)
  KVQ_BIN   the kvq command (for the C decoder's perplexity and tokenizer);
            the perplexity test skips without it
Every comparison is against an independent computation made in the same
run: the CPU libkvq (same cache config and seed give the same pages),
transformers with DynamicCache, or the C decoder (`kvq ppl`).
"""
import json
import math
import os
import re
import subprocess
import sys

from runner import Skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TINY = os.path.join(REPO, "models", "kvq-tiny-llama")
PASSKEY = os.path.join(REPO, "models", "passkey-3500.txt")

torch = transformers = None


def setup():
    global torch, transformers
    try:
        import torch as _t
    except ImportError:
        raise Skip("torch is not installed")
    if not hasattr(_t, "library") or not hasattr(_t.library, "custom_op"):
        raise Skip(f"torch {_t.__version__} has no torch.library.custom_op (needs >= 2.4)")
    if not _t.cuda.is_available():
        raise Skip("no CUDA device visible to torch")
    try:
        import transformers as _tr
    except ImportError:
        raise Skip("transformers is not installed")
    from kvq_torch import _lib
    try:
        _lib.lib()
    except OSError as e:
        raise Skip(str(e))
    if _lib.device_count() < 1:
        raise Skip(f"{_lib.lib_path()} sees no CUDA device (a library built without nvcc?)")
    torch, transformers = _t, _tr


def _rel(a, b):
    return (a.double() - b.double()).norm().item() / max(b.double().norm().item(), 1e-30)


def test_environment():
    from kvq_torch import _lib
    return {"detail": f"torch {torch.__version__}, transformers {transformers.__version__}, "
                      f"{_lib.device_describe()}, lib {_lib.lib_path()}",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "device": _lib.device_describe()}


# ---- the ops against the CPU library ----------------------------------------

def _host_ref(tk, tv, seed, recent, chunks, q, H, D, G, scale):
    """CPU kvq_cache + kvq_attn_decode over the same appends: [Hq, D] output."""
    from kvq_torch.host_cache import HostCache
    total = sum(c[0].shape[0] for c in chunks)
    hc = HostCache(H, D, total + 8, tk, tv, seed=seed, recent_f16=recent, max_q=G)
    for k, v in chunks:
        k32, v32 = k.float().cpu().contiguous(), v.float().cpu().contiguous()
        hc.append(k.shape[0], k32.data_ptr(), v32.data_ptr())
    q32 = q.float().cpu().contiguous()
    out = torch.empty_like(q32)
    for h in range(H):
        hc.decode(h, total, q32[h * G].data_ptr(), G, scale, out[h * G].data_ptr())
    hc.close()
    return out


def test_ops_decode_matches_cpu():
    """append (chunks) + append_batch + attend on the GPU == the CPU cache's
    kvq_attn_decode, per sequence and query head, for 3 sequences of
    different lengths, GQA 4, bf16 inputs."""
    from kvq_torch import ops
    from kvq_torch.device_cache import DeviceCache
    H, G, D, B = 2, 4, 128, 3
    lens = [1, 77, 300]
    scale = D ** -0.5
    worst = {}
    g = torch.Generator(device="cuda").manual_seed(7)
    for tk, tv, recent in (("tq3j", "tq3", True), ("tq3j", "tq3", False), ("f16", "f16", False), ("tq4j", "tq3", False)):
        dc = DeviceCache(H, D, 512, B, tk, tv, seed=11, recent_f16=recent)
        h, anchor = ops.register(dc), torch.zeros(1, dtype=torch.int64)
        chunks = []
        for b in range(B):
            k = torch.randn(lens[b], H, D, generator=g, device="cuda").to(torch.bfloat16)
            v = torch.randn(lens[b], H, D, generator=g, device="cuda").to(torch.bfloat16)
            k[:, :, 5] *= 8  # outlier channel, as real keys have
            torch.ops.kvq.append(h, b, k, v, anchor)
            chunks.append([(k, v)])
        kn = torch.randn(B, H, D, generator=g, device="cuda").to(torch.bfloat16)
        vn = torch.randn(B, H, D, generator=g, device="cuda").to(torch.bfloat16)
        torch.ops.kvq.append_batch(h, kn, vn, anchor)
        q = (2 * torch.randn(B, H * G, D, generator=g, device="cuda")).to(torch.bfloat16)
        out = torch.ops.kvq.attend(h, q, scale, anchor)
        torch.cuda.synchronize()
        assert out.dtype == torch.bfloat16 and out.shape == q.shape
        assert [dc.length(b) for b in range(B)] == [n + 1 for n in lens]
        assert int(anchor.item()) == sum(lens) + B
        out32 = torch.ops.kvq.attend(h, q.float(), scale, anchor)
        err = 0.0
        for b in range(B):
            ref = _host_ref(tk, tv, 11, recent, chunks[b] + [(kn[b:b + 1], vn[b:b + 1])], q[b], H, D, G, scale)
            for hq in range(H * G):
                err = max(err, _rel(out32[b, hq].cpu(), ref[hq]))
        ops.unregister(h)
        worst[f"{tk}/{tv}{'+win' if recent else ''}"] = err
        assert err < 1e-3, f"{tk}/{tv} recent={recent}: GPU vs CPU attention {err:.3g} (limit 1e-3)"
    return {"detail": ", ".join(f"{k} {v:.2g}" for k, v in worst.items()), "rel_err": worst}


def test_ops_prefix_matches_cpu():
    """attend_prefix over a 150-token chunk: entry i == the CPU decode over i + 1 tokens."""
    from kvq_torch import ops
    from kvq_torch.device_cache import DeviceCache
    from kvq_torch.host_cache import HostCache
    H, G, D, T = 2, 4, 128, 150
    scale = D ** -0.5
    g = torch.Generator(device="cuda").manual_seed(3)
    dc = DeviceCache(H, D, 256, 1, "tq3j", "tq3", seed=2, recent_f16=False)
    h, anchor = ops.register(dc), torch.zeros(1, dtype=torch.int64)
    k = torch.randn(T, H, D, generator=g, device="cuda")
    v = torch.randn(T, H, D, generator=g, device="cuda")
    q = torch.randn(T, H * G, D, generator=g, device="cuda")
    torch.ops.kvq.append(h, 0, k[:20], v[:20], anchor)
    torch.ops.kvq.append(h, 0, k[20:], v[20:], anchor)
    out = torch.ops.kvq.attend_prefix(h, 0, 20, q[20:], scale, anchor).cpu()
    hc = HostCache(H, D, 256, "tq3j", "tq3", seed=2, recent_f16=False, max_q=G)
    kc, vc, qc = k.cpu().contiguous(), v.cpu().contiguous(), q.cpu().contiguous()
    hc.append(T, kc.data_ptr(), vc.data_ptr())
    ref = torch.empty(G, D)
    err = 0.0
    for i in range(T - 20):
        for hk in range(H):
            hc.decode(hk, 20 + i + 1, qc[20 + i, hk * G].data_ptr(), G, scale, ref.data_ptr())
            for j in range(G):
                err = max(err, _rel(out[i, hk * G + j], ref[j]))
    hc.close()
    ops.unregister(h)
    assert err < 1e-3, f"attend_prefix vs CPU decode: {err:.3g}"
    return {"detail": f"130 positions x 8 heads, worst {err:.2g}", "rel_err": err}


def test_ops_trace_and_compile():
    """The fake implementations pass torch.library.opcheck, and decode_step
    compiled with torch.compile(fullgraph=True) gives what eager append_batch
    + attend give."""
    from kvq_torch import ops
    from kvq_torch.device_cache import DeviceCache
    H, G, D, B = 2, 4, 128, 2
    g = torch.Generator(device="cuda").manual_seed(5)
    k0 = torch.randn(B, 90, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
    v0 = torch.randn(B, 90, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
    steps = [(torch.randn(B, H, D, generator=g, device="cuda", dtype=torch.bfloat16),
              torch.randn(B, H, D, generator=g, device="cuda", dtype=torch.bfloat16),
              torch.randn(B, H * G, D, generator=g, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]

    def make():
        dc = DeviceCache(H, D, 256, B, "tq3j", "tq3", seed=1)
        h, a = ops.register(dc), torch.zeros(1, dtype=torch.int64)
        for b in range(B):
            torch.ops.kvq.append(h, b, k0[b], v0[b], a)
        return h, a

    def step(h, a, k, v, q):  # the two ops
        torch.ops.kvq.append_batch(h, k, v, a)
        return torch.ops.kvq.attend(h, q, D ** -0.5, a) * 1.0

    def fused(h, a, k, v, q):  # what the attention function calls
        return torch.ops.kvq.decode_step(h, k, v, q, D ** -0.5, a) * 1.0

    import torch._dynamo as dynamo  # a plain `import torch._dynamo` here would make torch local to the function
    he, ae = make()
    eager = [step(he, ae, *s) for s in steps]
    hc, ac = make()
    dynamo.reset()
    cstep = torch.compile(fused, fullgraph=True)
    comp = [cstep(hc, ac, *s) for s in steps]
    torch.cuda.synchronize()
    for i, (x, y) in enumerate(zip(eager, comp)):
        assert torch.equal(x, y), f"compiled step {i} differs from eager: {_rel(y, x):.3g}"
    assert ops.cache_of(hc).length(0) == 94, "the compiled appends did not all run"
    ht, at = make()
    q = steps[0][2]
    torch.library.opcheck(torch.ops.kvq.attend.default, (ht, q, D ** -0.5, at),
                          test_utils=("test_schema", "test_faketensor"))
    for h in (he, hc, ht):
        ops.unregister(h)
    return "opcheck(attend) ok; 4 decode_step calls compiled (fullgraph) == eager append_batch + attend, bit for bit"


# ---- models ---------------------------------------------------------------

def _load(path, dtype):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa", device_map="cuda")
    m.eval()
    return m


def _tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))


def _encode(tok, text):
    """The prompt as kvq and the fixtures tokenize it: BOS, then the text.
    The bundled tokenizer.json has no post-processor, so tokenizers adds no
    BOS itself (and the model answers nothing sensible without it)."""
    bos = tok.token_to_id("<s>")
    assert bos is not None, "the bundled tokenizer has no <s>"
    return [bos] + tok.encode(text, add_special_tokens=False).ids


def _generate(model, ids, n, cache=None, mask=None, impl="sdpa"):
    import kvq_torch
    kvq_torch.use_kvq(model, impl)
    kw = {"attention_mask": mask if mask is not None else torch.ones_like(ids)}
    if cache is not None:
        kw["past_key_values"] = cache
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n, **kw)
    kvq_torch.use_kvq(model, "sdpa")
    return out[:, ids.shape[1]:]


def _first_diff(a, b):
    a, b = a.tolist(), b.tolist()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_tiny_greedy_f16_pages_equal_dynamic():
    """Bundled model: greedy ids of every fixture prompt with KVQCache over
    f16 pages == DynamicCache's, and a left-padded batch of two. In float32
    (both caches then differ only by the f16 rounding of K/V, ~5e-4); the
    same comparison in bf16 is reported (there SDPA rounds its softmax
    weights to bf16 and the fused kernel does not)."""
    from kvq_torch import KVQCache
    ref = json.load(open(os.path.join(TINY, "reference", "reference.json")))
    tok = _tokenizer()
    n_new, res = 24, {}
    for dtype in (torch.float32, torch.bfloat16):
        model = _load(TINY, dtype)
        same, fixture_same, first_diff = 0, 0, {}
        for case in ref["cases"]:
            ids = torch.tensor([_encode(tok, case["text"])], device="cuda")
            assert ids.shape[1] == case["n_tokens"], f"{case['name']}: {ids.shape[1]} tokens, fixture says {case['n_tokens']}"
            a = _generate(model, ids, n_new)
            b = _generate(model, ids, n_new, KVQCache(model.config, k="f16", v="f16"), impl="kvq")
            d = _first_diff(a[0], b[0])
            if d is None:
                same += 1
            else:
                first_diff[case["name"]] = d
            fx = case["greedy_ids"][:n_new]
            fixture_same += a[0, :len(fx)].tolist() == fx
        # a batch of two prompts of different lengths, left-padded
        p1 = _encode(tok, ref["cases"][0]["text"])
        p2 = _encode(tok, ref["cases"][1]["text"])
        L = max(len(p1), len(p2))
        ids = torch.tensor([[0] * (L - len(p)) + p for p in (p1, p2)], device="cuda")
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in (p1, p2)], device="cuda")
        a = _generate(model, ids, 16, mask=mask)
        b = _generate(model, ids, 16, KVQCache(model.config, k="f16", v="f16"), mask=mask, impl="kvq")
        name = "f32" if dtype == torch.float32 else "bf16"
        res[name] = {"prompts_equal": same, "prompts": len(ref["cases"]), "first_diff": first_diff,
                     "padded_batch_equal": bool(torch.equal(a, b)), "dynamic_matches_fixture": fixture_same}
        del model
        torch.cuda.empty_cache()
    f = res["f32"]
    assert f["prompts_equal"] == f["prompts"], f"float32: KVQCache f16 differs from DynamicCache: first new token " \
                                               f"that differs, per prompt: {f['first_diff']}"
    assert f["padded_batch_equal"], "float32: the padded batch differs between KVQCache f16 and DynamicCache"
    b = res["bf16"]
    return dict(res, detail=f"f32: {f['prompts_equal']}/{f['prompts']} prompts x {n_new} tokens and the padded batch "
                            f"equal; bf16 (informational): {b['prompts_equal']}/{b['prompts']} equal, padded batch "
                            f"{'equal' if b['padded_batch_equal'] else 'differs'}; DynamicCache f32 matches the "
                            f"fixture's HF greedy ids on {f['dynamic_matches_fixture']}/{f['prompts']}")


def test_tiny_passkey_tq3():
    """The passkey prompt (3515 tokens) is answered on tq3j/tq3 pages, with
    SDPA prefill (default) and with the C decoder's compressed prefill."""
    from kvq_torch import KVQCache
    text = open(PASSKEY).read()
    text = text[:-1] if text.endswith("\n") else text  # as `kvq run -f` reads it: the editor's newline is no prompt
    key = re.search(r"pass key is (\d+)", text).group(1)  # the key the prompt states
    tok = _tokenizer()
    ids = torch.tensor([_encode(tok, text)], device="cuda")
    model = _load(TINY, torch.bfloat16)
    got = {}
    for mode in ("sdpa", "kvq"):
        cache = KVQCache(model.config, k="tq3j", v="tq3", prefill=mode)
        out = _generate(model, ids, 12, cache, impl="kvq")
        ans = tok.decode(out[0].tolist())
        got[mode] = {"answer": ans, "kv_bytes": cache.kv_bytes()}
        cache.close()
    base = tok.decode(_generate(model, ids, 12)[0].tolist())
    for mode, r in got.items():
        assert key in r["answer"], f"prefill={mode}: key {key} not in {r['answer']!r} (DynamicCache said {base!r})"
    return {"detail": f"key {key} found with prefill sdpa and kvq ({ids.shape[1]} prompt tokens; "
                      f"pages {got['sdpa']['kv_bytes'] / 2**20:.2f} MiB)", "key": key, "prompt_tokens": ids.shape[1],
            "answers": {m: r["answer"] for m, r in got.items()}, "dynamic_answer": base}


def _kvq_bin():
    b = os.environ.get("KVQ_BIN")
    if not b or not os.path.exists(b):
        raise Skip("KVQ_BIN (the kvq command) is not set: no C decoder to compare with")
    return b


def _c_ppl(kvq, text_file, ctx, n, tk, tv):
    """`kvq ppl` on the GPU decoder (same device cache and kernels; within 0.07% of
    the CPU decoder, docs/decoder.md), on the CPU decoder if the GPU one fails."""
    cmd = [kvq, "ppl", "--model", TINY, "--file", text_file, "--ctx", str(ctx), "--max-tokens", str(n),
           "-ctk", tk, "-ctv", tv, "--json", "--quiet"]
    r = subprocess.run(cmd + ["--device", "cuda"], capture_output=True, text=True)
    if r.returncode == 0:
        return dict(json.loads(r.stdout), c_device="cuda")
    print(f"kvq ppl --device cuda failed ({r.stderr.strip()[:200]}); using the CPU decoder", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout), c_device="cpu")


def _py_ppl(model, ids, ctx, chunk, cache_fn, bos):
    """kvq ppl's windows (eval/eval_ppl.c): BOS + ctx - 1 text tokens each,
    forwarded in chunks, every token but the first predicted."""
    nll, scored = 0.0, 0
    per_win = ctx - 1
    for w0 in range(0, len(ids), per_win):
        win = [bos] + ids[w0:w0 + per_win]
        cache = cache_fn()
        for c0 in range(0, len(win), chunk):
            x = torch.tensor([win[c0:c0 + chunk]], device="cuda")
            with torch.no_grad():
                logits = model(x, past_key_values=cache, use_cache=True).logits[0].double()
            # row r predicts window position c0 + r + 1 (the last row of the window predicts nothing)
            tgt = win[c0 + 1:c0 + x.shape[1] + 1]
            lp = logits[:len(tgt)].log_softmax(-1)
            nll -= lp.gather(1, torch.tensor(tgt, device="cuda")[:, None]).sum().item()
            scored += len(tgt)
        if hasattr(cache, "close"):
            cache.close()
    return math.exp(nll / scored), scored


def test_tiny_ppl_matches_c_decoder():
    """Perplexity through transformers + KVQCache(prefill="kvq") vs `kvq ppl`
    with the same cache (tq3j/tq3 with the f16 window; f16/f16), same windows
    and chunks: within 0.5%."""
    import kvq_torch
    from kvq_torch import KVQCache
    from transformers import DynamicCache
    kvq = _kvq_bin()
    text_file = os.path.join(TINY, "reference", "valid.txt")
    ctx, n, chunk = 2048, 4096, 256
    r = subprocess.run([kvq, "tokenize", "--model", TINY, "--file", text_file, "--no-bos", "--json"],
                       capture_output=True, text=True, check=True)
    ids = json.loads(r.stdout)["ids"][:n]
    hf_ids = _tokenizer().encode(open(text_file).read(), add_special_tokens=False).ids[:n]
    model = _load(TINY, torch.float32)
    bos = model.config.bos_token_id
    res = {"tokenizer_ids_equal": ids == hf_ids}
    for tk, tv in (("tq3j", "tq3"), ("f16", "f16")):
        c = _c_ppl(kvq, text_file, ctx, n, tk, tv)
        kvq_torch.use_kvq(model, "kvq")
        p, scored = _py_ppl(model, ids, ctx, chunk, lambda: KVQCache(model.config, k=tk, v=tv, prefill="kvq",
                                                                     max_cache_len=ctx), bos)
        kvq_torch.use_kvq(model, "sdpa")
        assert scored == c["scored"], f"{scored} tokens scored, kvq ppl scored {c['scored']}"
        rel = p / c["ppl"] - 1
        res[f"{tk}/{tv}"] = {"torch": p, "c": c["ppl"], "rel": rel, "c_recent_f16": c.get("recent_f16"),
                             "c_device": c["c_device"]}
        assert abs(rel) < 0.005, f"{tk}/{tv}: ppl {p:.4f} vs the C decoder's {c['ppl']:.4f} ({100 * rel:+.3f}%)"
    p_dyn, _ = _py_ppl(model, ids, ctx, chunk, lambda: DynamicCache(), bos)
    res["dynamic_f32"] = p_dyn
    q = res["tq3j/tq3"]
    return dict(res, detail=f"tq3j/tq3 {q['torch']:.4f} vs C ({q['c_device']}) {q['c']:.4f} ({100 * q['rel']:+.3f}%), f16 "
                            f"{res['f16/f16']['torch']:.4f} vs {res['f16/f16']['c']:.4f}; DynamicCache f32 {p_dyn:.4f}; "
                            f"tokenizers ids == kvq's: {res['tokenizer_ids_equal']}")


def _llama31(layers):
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import hf_llama_shape
    return hf_llama_shape.random_model("llama31-8b", layers, seed=0)


def test_llama31_shape_greedy_equal():
    """A random-weight Llama-3.1-8B-shaped checkpoint with 2 layers
    (bench/hf_llama_shape.py's generator, its bf16 weights run in float32):
    greedy ids with KVQCache over f16 pages == DynamicCache's, batch 1 and 2;
    tq3j/tq3 agreement reported."""
    from kvq_torch import KVQCache
    model = _llama31(2).float()  # float32: the caches then differ only by the f16 rounding of K/V
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=g, device="cuda")
    n = 16
    a = _generate(model, ids[:1], n)
    b = _generate(model, ids[:1], n, KVQCache(model.config, k="f16", v="f16", max_cache_len=256), impl="kvq")
    d = _first_diff(a[0], b[0])
    assert d is None, f"batch 1: f16 pages differ from DynamicCache at new token {d}"
    a2 = _generate(model, ids, n)
    b2 = _generate(model, ids, n, KVQCache(model.config, k="f16", v="f16", max_cache_len=256), impl="kvq")
    assert torch.equal(a2, b2), f"batch 2: {a2.tolist()} vs {b2.tolist()}"
    c = _generate(model, ids[:1], n, KVQCache(model.config, k="tq3j", v="tq3", max_cache_len=256), impl="kvq")
    agree = _first_diff(a[0], c[0])
    del model
    torch.cuda.empty_cache()
    return {"detail": f"{n} tokens equal (batch 1 and 2); tq3j/tq3 agrees for "
                      f"{n if agree is None else agree}/{n} tokens", "tq3_agree": n if agree is None else agree}


def test_key_outlier_layers_f16():
    """tests/models/qwen2_kbias (first and last layers' k_proj bias 30x the
    median norm): key_outlier_layers finds exactly those layers, KVQCache
    keeps their keys in f16, and that lowers tq3j/tq3's KL against the
    float32 DynamicCache over the fixture's prompt (as the C decoder's guard
    does, docs/models.md)."""
    from kvq_torch import KVQCache, key_outlier_layers
    from safetensors.torch import load_file
    d = os.path.join(REPO, "tests", "models", "qwen2_kbias")
    model = _load(d, torch.float32)
    n = model.config.num_hidden_layers
    marked = key_outlier_layers(model)
    assert marked == [0, n - 1], f"key_outlier_layers: {marked}"
    ids = load_file(os.path.join(d, "reference.safetensors"))["ids"].to(torch.int64).cuda()[None]
    import kvq_torch
    with torch.no_grad():
        kvq_torch.use_kvq(model, "sdpa")
        ref = model(ids).logits.float().log_softmax(-1)
        kl = {}
        for name, layers in (("guard", marked), ("none", [])):
            kvq_torch.use_kvq(model, "kvq")
            cache = KVQCache(model.config, k="tq3j", v="tq3", recent_f16=False, prefill="kvq",
                             max_cache_len=ids.shape[1] + 8, f16_key_layers=layers)
            lp = model(ids, past_key_values=cache).logits.float().log_softmax(-1)
            kvq_torch.use_kvq(model, "sdpa")
            types = [l.dc.type_k for l in cache.layers]
            cache.close()
            kl[name] = float((ref.exp() * (ref - lp)).sum(-1).mean())
            if name == "guard":
                assert types == ["f16" if i in marked else "tq3j" for i in range(n)], f"K types: {types}"
    del model
    torch.cuda.empty_cache()
    assert kl["guard"] < 0.75 * kl["none"], f"mean KL with f16 keys on {marked}: {kl['guard']:.4g}, without: {kl['none']:.4g}"
    return {"detail": f"layers {marked} marked; tq3j/tq3 mean KL vs DynamicCache f32 {kl['guard']:.4g} with their "
                      f"keys in f16, {kl['none']:.4g} without", "kl": kl}


def test_tensor_parallel_world_size_1():
    """tp_plan="auto" under a one-process NCCL group: KVQCache (sized from the
    heads each rank receives) gives the same greedy ids as DynamicCache."""
    import torch.distributed as dist
    from kvq_torch import KVQCache
    from transformers import AutoModelForCausalLM
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29531")):
        os.environ.setdefault(k, v)
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.bfloat16, tp_plan="auto",
                                                 attn_implementation="sdpa")
    model.eval()
    placed = next(model.parameters()).device
    if placed.type != "cuda":  # transformers 5.17 leaves a world-size-1 "TP" model where it loaded it
        model.to("cuda")
    ids = torch.tensor([_encode(_tokenizer(), open(PASSKEY).read()[:2000])], device="cuda")
    a = _generate(model, ids, 16)
    cache = KVQCache(model.config, k="f16", v="f16")
    b = _generate(model, ids, 16, cache, impl="kvq")
    heads = cache.layers[0].dc.n_kv_heads
    dist.destroy_process_group()
    assert torch.equal(a, b), f"tp world size 1: {a.tolist()} vs {b.tolist()}"
    return (f"tp_plan=auto, world size 1 (loaded on {placed}): 16 tokens equal; the cache took {heads} KV heads "
            "from the tensors")


TESTS = [test_environment, test_ops_decode_matches_cpu, test_ops_prefix_matches_cpu, test_ops_trace_and_compile,
         test_tiny_greedy_f16_pages_equal_dynamic, test_tiny_passkey_tq3, test_tiny_ppl_matches_c_decoder,
         test_llama31_shape_greedy_equal, test_key_outlier_layers_f16, test_tensor_parallel_world_size_1]
