#!/usr/bin/env python3
"""gguf_write.py - converts a Hugging Face Llama checkpoint (safetensors, one
file or sharded with model.safetensors.index.json, + config.json +
tokenizer.json) into one GGUF file that llama.cpp loads, with the standard
library only (no numpy, no gguf package): the bench compares kvq with
llama.cpp's CPU build on the same weights.

  python3 bench/gguf_write.py MODEL_DIR OUT.gguf [--type f32|f16|bf16] [--ctx N]

--type: the matrices' type (1-D norm weights stay f32, as llama.cpp expects).
  bf16 keeps a bf16 checkpoint's bits; f32 widens them exactly; f16 rounds
  (to nearest even) and is exact for bf16 values in f16's normal range.
--ctx: write N as the context length instead of max_position_embeddings (a
  speed measurement past the trained context; RoPE "default" does not depend
  on it).

Supported: model_type llama (LlamaForCausalLM), rope_type default, a BPE
tokenizer in the Llama-2 / SentencePiece style (Metaspace pre-tokenizer,
byte fallback), which maps onto llama.cpp's "llama" (SPM) tokenizer. Anything
else is refused rather than converted approximately.

File layout (GGUF version 3, little-endian): magic, version, tensor count,
metadata count; metadata key/value pairs; tensor infos (name, dims innermost
first, ggml type, offset into the data section); then the data section,
every tensor aligned to general.alignment (32) bytes.
"""
import argparse, json, os, struct, sys

GGUF_VERSION = 3
ALIGN = 32
# metadata value types (GGUF spec)
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
# ggml tensor types
GGML = {"f32": 0, "f16": 1, "bf16": 30}
ESZ = {"f32": 4, "f16": 2, "bf16": 2}
# llama.cpp's token types (llama.h, enum llama_token_type)
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6


def read_safetensors(model_dir):
    """{name: (dtype, shape, raw bytes)} over every shard."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with open(os.path.join(model_dir, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
            base = 8 + n
            for name, info in hdr.items():
                if name == "__metadata__":
                    continue
                a, b = info["data_offsets"]
                f.seek(base + a)
                out[name] = (info["dtype"], info["shape"], f.read(b - a))
    return out


def to_f32_bytes(dtype, raw):
    """Little-endian f32 bytes of a tensor stored as F32, BF16 or F16."""
    if dtype == "F32":
        return raw
    if dtype == "BF16":
        # a bf16 is the top half of an f32: place its two bytes above two zeros
        n = len(raw) // 2
        out = bytearray(4 * n)
        out[2::4] = raw[0::2]
        out[3::4] = raw[1::2]
        return bytes(out)
    if dtype == "F16":
        n = len(raw) // 2
        return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", raw))
    raise SystemExit(f"gguf_write: unsupported tensor dtype {dtype}")


def encode(dtype, raw, want):
    """The tensor's bytes in ggml type `want` (f32, f16, bf16)."""
    if want == "bf16" and dtype == "BF16":
        return raw
    f32 = to_f32_bytes(dtype, raw)
    if want == "f32":
        return f32
    n = len(f32) // 4
    if want == "f16":
        # struct's 'e' rounds to nearest even and raises on overflow: a weight
        # beyond f16's range fails the conversion instead of becoming inf
        return struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", f32))
    # bf16 from f32/f16: round to nearest even on the dropped 16 bits
    words = struct.unpack(f"<{n}I", f32)
    return struct.pack(f"<{n}H", *(((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words))


def permute_rows(raw, esz, n_head, rows, cols):
    """Reorders a q or k projection's rows from HF's rotate-half layout (within
    each head, coordinate i pairs with i + d/2) to the adjacent-pair layout
    that llama.cpp's LLAMA rope (type NORM) rotates (pairs 2i, 2i+1): new row
    h*d + 2i + j takes old row h*d + j*d/2 + i. Attention scores are unchanged
    because q and k are permuted alike."""
    d = rows // n_head
    half = d // 2
    rb = cols * esz
    out = bytearray(len(raw))
    for h in range(n_head):
        for i in range(half):
            for j in range(2):
                src = h * d + j * half + i
                dst = h * d + 2 * i + j
                out[dst * rb:(dst + 1) * rb] = raw[src * rb:(src + 1) * rb]
    return bytes(out)


class Writer:
    def __init__(self):
        self.kv = []       # encoded metadata pairs
        self.tensors = []  # (name, dims innermost first, type name, bytes)

    @staticmethod
    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def add(self, key, vtype, value):
        body = struct.pack("<I", vtype)
        if vtype == T_STR:
            body += self.s(value)
        elif vtype == T_U32:
            body += struct.pack("<I", value)
        elif vtype == T_I32:
            body += struct.pack("<i", value)
        elif vtype == T_F32:
            body += struct.pack("<f", value)
        elif vtype == T_BOOL:
            body += struct.pack("<B", 1 if value else 0)
        else:
            raise ValueError(vtype)
        self.kv.append(self.s(key) + body)

    def add_array(self, key, etype, values):
        body = struct.pack("<IIQ", T_ARR, etype, len(values))
        if etype == T_STR:
            body += b"".join(self.s(v) for v in values)
        elif etype == T_F32:
            body += struct.pack(f"<{len(values)}f", *values)
        elif etype == T_I32:
            body += struct.pack(f"<{len(values)}i", *values)
        else:
            raise ValueError(etype)
        self.kv.append(self.s(key) + body)

    def tensor(self, name, dims, tname, data):
        n = 1
        for d in dims:
            n *= d
        assert len(data) == n * ESZ[tname], (name, len(data), dims, tname)
        self.tensors.append((name, dims, tname, data))

    def write(self, path):
        infos, off = [], 0
        for name, dims, tname, data in self.tensors:
            infos.append(self.s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                         + struct.pack("<IQ", GGML[tname], off))
            off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        head = b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))
        head += b"".join(self.kv) + b"".join(infos)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(b"\0" * (-len(head) % ALIGN))
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGN))
        os.replace(tmp, path)


def tokenizer_metadata(w, model_dir, cfg):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tj = json.load(f)
    m = tj["model"]
    pre = json.dumps(tj.get("pre_tokenizer"))
    if m.get("type") != "BPE" or not m.get("byte_fallback") or "Metaspace" not in pre:
        raise SystemExit("gguf_write: only a SentencePiece-style BPE tokenizer (Metaspace, byte fallback) is supported")
    vocab = m["vocab"]
    n = cfg["vocab_size"]
    tokens = [None] * n
    for t, i in vocab.items():
        if i < n:
            tokens[i] = t
    special = {}
    for a in tj.get("added_tokens", []):
        if a["id"] < n:
            tokens[a["id"]] = a["content"]
            special[a["id"]] = a.get("special", False)
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise SystemExit(f"gguf_write: token ids without text, e.g. {missing[:5]}")
    # llama.cpp's SPM tokenizer merges the adjacent pair whose concatenation
    # has the highest score; BPE applies the lowest-ranked merge first. So a
    # merge's result scores minus its rank; tokens no merge produces (single
    # characters, bytes, specials) score below every merge.
    merges = m.get("merges", [])
    scores = [-1e9] * n
    for rank, mg in enumerate(merges):
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        i = vocab.get(a + b)
        if i is not None and i < n and scores[i] == -1e9:
            scores[i] = -float(rank)
    types = []
    for i, t in enumerate(tokens):
        if t == m.get("unk_token"):
            types.append(TOK_UNKNOWN)
        elif special.get(i):
            types.append(TOK_CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(TOK_BYTE)
        else:
            types.append(TOK_NORMAL)
    first = any(p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") in ("first", "always")
                for p in tj["pre_tokenizer"].get("pretokenizers", [tj["pre_tokenizer"]]))
    w.add("tokenizer.ggml.model", T_STR, "llama")
    w.add_array("tokenizer.ggml.tokens", T_STR, tokens)
    w.add_array("tokenizer.ggml.scores", T_F32, scores)
    w.add_array("tokenizer.ggml.token_type", T_I32, types)
    for key, cid in (("bos", cfg.get("bos_token_id")), ("eos", cfg.get("eos_token_id"))):
        if cid is not None:
            w.add(f"tokenizer.ggml.{key}_token_id", T_U32, cid)
    if m.get("unk_token") in vocab:
        w.add("tokenizer.ggml.unknown_token_id", T_U32, vocab[m["unk_token"]])
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", T_BOOL, False)
    w.add("tokenizer.ggml.add_space_prefix", T_BOOL, first)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--ctx", type=int, default=0)
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"gguf_write: model_type {cfg.get('model_type')!r} is not llama")
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise SystemExit("gguf_write: only rope_type default is supported")
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hidden = cfg["hidden_size"]
    hd = cfg.get("head_dim") or hidden // H
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("gguf_write: biases are not supported")

    w = Writer()
    w.add("general.architecture", T_STR, "llama")
    w.add("general.name", T_STR, os.path.basename(os.path.normpath(a.model_dir)))
    w.add("general.alignment", T_U32, ALIGN)
    w.add("general.file_type", T_U32, {"f32": 0, "f16": 1, "bf16": 32}[a.type])  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16
    w.add("llama.context_length", T_U32, a.ctx or cfg["max_position_embeddings"])
    w.add("llama.embedding_length", T_U32, hidden)
    w.add("llama.block_count", T_U32, L)
    w.add("llama.feed_forward_length", T_U32, cfg["intermediate_size"])
    w.add("llama.attention.head_count", T_U32, H)
    w.add("llama.attention.head_count_kv", T_U32, KV)
    w.add("llama.attention.key_length", T_U32, hd)
    w.add("llama.attention.value_length", T_U32, hd)
    w.add("llama.attention.layer_norm_rms_epsilon", T_F32, cfg["rms_norm_eps"])
    w.add("llama.rope.dimension_count", T_U32, hd)
    w.add("llama.rope.freq_base", T_F32, float(theta))
    w.add("llama.vocab_size", T_U32, cfg["vocab_size"])
    tokenizer_metadata(w, a.model_dir, cfg)

    st = read_safetensors(a.model_dir)
    used = set()

    def put(hf, gg, permute_heads=0):
        dtype, shape, raw = st[hf]
        used.add(hf)
        if len(shape) == 1:
            w.tensor(gg, [shape[0]], "f32", to_f32_bytes(dtype, raw))
            return
        rows, cols = shape
        data = encode(dtype, raw, a.type)
        if permute_heads:
            data = permute_rows(data, ESZ[a.type], permute_heads, rows, cols)
        w.tensor(gg, [cols, rows], a.type, data)  # ggml dims: innermost (columns) first

    put("model.embed_tokens.weight", "token_embd.weight")
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(p + "input_layernorm.weight", b + "attn_norm.weight")
        put(p + "self_attn.q_proj.weight", b + "attn_q.weight", H)
        put(p + "self_attn.k_proj.weight", b + "attn_k.weight", KV)
        put(p + "self_attn.v_proj.weight", b + "attn_v.weight")
        put(p + "self_attn.o_proj.weight", b + "attn_output.weight")
        put(p + "post_attention_layernorm.weight", b + "ffn_norm.weight")
        put(p + "mlp.gate_proj.weight", b + "ffn_gate.weight")
        put(p + "mlp.up_proj.weight", b + "ffn_up.weight")
        put(p + "mlp.down_proj.weight", b + "ffn_down.weight")
    put("model.norm.weight", "output_norm.weight")
    if "lm_head.weight" in st and not cfg.get("tie_word_embeddings"):
        put("lm_head.weight", "output.weight")
    left = sorted(set(st) - used)
    if left:
        raise SystemExit(f"gguf_write: tensors not converted: {left[:5]}")
    w.write(a.out)
    print(f"gguf_write: {a.out}: {len(w.tensors)} tensors, {a.type}, ctx {a.ctx or cfg['max_position_embeddings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
