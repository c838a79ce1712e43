#!/usr/bin/env python3
"""experts_synth.py - a random-weight qwen3_moe checkpoint whose experts are
as large as a real model's (default: Qwen3-30B-A3B's hidden 2048, experts of
768, 128 experts top 8, in 2 sparse layers: 2 x 128 x 9.4 MB = 2.4 GB of
experts), for bench_experts --direct, and the disk's own read rate of that
file with O_DIRECT in the same sitting.

  python3 bench/experts_synth.py --out DIR [--experts E] [--top-k K] [--layers L]
  python3 bench/experts_synth.py --out DIR --disk-only     (re-measure the disk)

The weights are a tiled block of N(0, 0.02) bf16 values (norms 1), so the
forward stays finite; nothing here is meant to be predicted. Experts are
stored per expert, as on the Hub. The disk measurement reads the file's
expert bytes once with O_DIRECT in pieces of one expert tensor (3.1 MB at
the default shape), 1 and 4 reads in flight, and prints GB/s. No numpy.
"""
import argparse
import json
import mmap
import os
import random
import struct
import threading
import time
import zlib


def bf16_block(n, sd, seed):
    """n bf16 values of N(0, sd) as bytes (round to nearest even from f32)."""
    r = random.Random(seed)
    out = bytearray(2 * n)
    for i in range(n):
        b = struct.unpack("<I", struct.pack("<f", r.gauss(0.0, sd)))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        out[2 * i] = b & 255
        out[2 * i + 1] = b >> 8
    return bytes(out)


def write(a):
    H, F, E, V, L = a.hidden, a.moe_ffn, a.experts, 256, a.layers
    nh, nkv, d = 16, 4, 128
    tensors = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H]), ("lm_head.weight", [V, H])]
    for l in range(L):
        p = f"model.layers.{l}."
        tensors += [(p + "self_attn.q_proj.weight", [nh * d, H]), (p + "self_attn.k_proj.weight", [nkv * d, H]),
                    (p + "self_attn.v_proj.weight", [nkv * d, H]), (p + "self_attn.o_proj.weight", [H, nh * d]),
                    (p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d]),
                    (p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
                    (p + "mlp.gate.weight", [E, H])]
        for e in range(E):
            tensors += [(p + f"mlp.experts.{e}.gate_proj.weight", [F, H]),
                        (p + f"mlp.experts.{e}.up_proj.weight", [F, H]),
                        (p + f"mlp.experts.{e}.down_proj.weight", [H, F])]
    header, off = {}, 0
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(a.out, exist_ok=True)
    block = bf16_block(1 << 18, 0.02, 1)  # 512 KiB, tiled
    one = struct.pack("<H", 0x3F80)
    t0 = time.time()
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shape in tensors:
            n = 1
            for s in shape:
                n *= s
            if name.endswith("norm.weight"):
                f.write(one * n)
                continue
            left, at = 2 * n, zlib.crc32(name.encode()) % len(block) & ~1
            while left:
                piece = block[at:at + left]
                f.write(piece)
                left -= len(piece)
                at = 0
    cfg = {"model_type": "qwen3_moe", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": d, "intermediate_size": 4 * H, "vocab_size": V,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "num_experts": E,
           "num_experts_per_tok": a.top_k, "moe_intermediate_size": F, "norm_topk_prob": True,
           "tie_word_embeddings": False, "rope_theta": 1000000.0}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print(f"wrote {a.out}: {off / 1e9:.2f} GB of weights, {L} sparse layers x {E} experts of "
          f"{3 * H * F * 2 / 1e6:.1f} MB (top {a.top_k}) in {time.time() - t0:.0f} s", flush=True)
    return 8 + len(hj), off, 2 * H * F


def disk(path, start, size, piece):
    """Reads [start, start + size) of path once with O_DIRECT in aligned
    pieces of about `piece` bytes, 1 and 4 reads in flight: GB/s of each."""
    al = 4096
    piece = max(al, piece // al * al)
    lo, hi = start // al * al, (start + size) // al * al
    offs = list(range(lo, hi, piece))
    out = {}
    for n in (1, 4):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        lock, it = threading.Lock(), iter(offs)

        def run():
            buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
            while True:
                with lock:
                    o = next(it, None)
                if o is None:
                    return
                os.preadv(fd, [memoryview(buf)[:min(piece, hi - o)]], o)

        t0 = time.time()
        ths = [threading.Thread(target=run) for _ in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        dt = time.time() - t0
        os.close(fd)
        out[n] = (hi - lo) / dt / 1e9
        print(f"disk: {(hi - lo) / 1e9:.2f} GB with O_DIRECT in pieces of {piece / 1e6:.1f} MB, {n} in flight: "
              f"{out[n]:.2f} GB/s", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe-ffn", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--disk-only", action="store_true")
    a = ap.parse_args()
    path = os.path.join(a.out, "model.safetensors")
    if a.disk_only:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
        size = os.path.getsize(path)
        disk(path, 8 + n, size - 8 - n, 2 * a.hidden * a.moe_ffn)
        return
    data0, total, tensor = write(a)
    os.sync()  # O_DIRECT reads of dirty pages would wait for their writeback
    disk(path, data0, total, tensor)


if __name__ == "__main__":
    main()
