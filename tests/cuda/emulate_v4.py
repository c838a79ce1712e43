"""emulate_v4.py - a warp-level model of the fifth-pass score path (integer
tensor cores: fast_kernel<..., M_IM> in cuda_attn_fast.cu, im_segment in
cuda_segment.cuh; the fused kernel's key scores for tq keys and <= 4 query
heads per KV head, "V4" in docs/history/attention-cuda.md), written before
any device time to check its index arithmetic and its precision.

What it models, lane by lane, for one 16-token segment of tq3j keys:
- the prep side: each query in 24-bit fixed point (Q = 65536 hq + 256 mq +
  lq, all s8) and its B fragments of mma.m16n8k32 in two n-tiles, column
  2j: (hq | 0) and (lq | mq), column 2j + 1: (mq | hq) and zero, so that the
  k-slots (hk of 4 codes | lk of the same codes) give sum Q C / 256 =
  65536 A + 256 B + C up to the lq lk term; the QJL query likewise in 24 bits,
  divided by the value its sign bit carries (tiles: hi, mid | lo, zero);
- the kernel side: the codes in the device order of kvq_layout.h (built here
  from its definition), the code selectors (tq3_select32, ported bit for bit),
  one PRMT per 4 codes into the hi-byte table and one into the lo-byte table
  (the key's 16-bit fixed-point centroid C = 256 hk + lk), the sign bytes
  masked in place (sw & 0x01010101 << p, worth 2^p as a u8);
- the MMAs (PTX fragment layouts), int32 accumulators that start at the
  float bit pattern of 1.5 * 2^23 so that the result reads as a float
  without a conversion, and the per-lane combination into scores.
It asserts that every score is within 2e-6 of nk |q| |k| of the float64
score of the dequantised key (the f16 kernels' centroid rounding alone gives
5.2e-6 on these data), and that deliberate mapping mutations fail.

    python3 tests/cuda/emulate_v4.py        (pure Python, ~5 s; `make test`
                                             runs it through test_emulate_v4.sh)

A model, not the kernel: tests/test_cuda.c on a GPU is the real check."""
import math
import struct
import sys

import random

C3 = [-0.18839718597012406, -0.11813976699678064, -0.066585608047421557, -0.02160431064215225,
               0.02160431064215225, 0.066585608047421557, 0.11813976699678064, 0.18839718597012406]
MAGIC = 0x4B400000            # bit pattern of 1.5 * 2^23
MAGIC_F = 12582912.0
CMAX = 32000                  # |fixed-point value| <= CMAX keeps the high byte in s8
M32 = 0xFFFFFFFF


def i2f_bits(u):
    return struct.unpack('<f', struct.pack('<I', u & M32))[0]


def split16(v):
    """v (int, |v| <= 32639) -> (hi, lo) s8 with v = 256 hi + lo."""
    h = (v + 128) >> 8
    return h, v - 256 * h


def split24(v):
    """v (|v| <= 256 CMAX) -> (hi, mid, lo) s8 with v = 65536 hi + 256 mid + lo."""
    h = (v + 32896) >> 16  # r in [-32896, 32639]: mid and lo both fit s8
    r = v - 65536 * h
    m = (r + 128) >> 8
    return h, m, r - 256 * m


def int_scale(c):
    """The scale S for which round(S c_i) / S is nearest c_i relatively (host
    search, as in codebook_int_scale)."""
    cm = max(abs(x) for x in c)
    best, best_s = 1e9, 0.0
    n = 1 << 17
    for k in range(n + 1):
        s = CMAX / cm * (0.5 + 0.5 * k / n)
        e = 0.0
        for x in c:
            e = max(e, abs(round(x * s) - x * s) / abs(x * s))
            if e >= best:
                break
        if e < best:
            best, best_s = e, s
    return best_s, best


def sel32(w0, w1, w2):
    """tq3_select32: four selector words, nibble i of word k = code 8k + i."""
    s3 = (w0 >> 3) & 0x11111111
    s3 |= (w1 >> 2) & 0x22222222
    s3 |= (w2 >> 1) & 0x44444444
    return [w0 & 0x77777777, w1 & 0x77777777, w2 & 0x77777777, s3]


def prmt(a, b, sel):
    by = [(a >> (8 * i)) & 255 for i in range(4)] + [(b >> (8 * i)) & 255 for i in range(4)]
    r = 0
    for i in range(4):
        r |= by[(sel >> (4 * i)) & 7] << (8 * i)
    return r


def s8(x):
    return x - 256 if x >= 128 else x


def bytes4(r, signed=True):
    return [s8((r >> (8 * i)) & 255) if signed else (r >> (8 * i)) & 255 for i in range(4)]


def pack4(v):
    r = 0
    for i, x in enumerate(v):
        r |= (int(x) & 255) << (8 * i)
    return r


def imma(C, A, B, a_signed=True):
    """C[lane][0..3] (int32) += A (m16 x k32, 4 regs/lane) x B (k32 x n8, 2 regs/lane)."""
    Am = [[0] * 32 for _ in range(16)]
    Bm = [[0] * 8 for _ in range(32)]
    for l in range(32):
        g, t = l >> 2, l & 3
        a = [bytes4(x, a_signed) for x in A[l]]
        for i in range(4):
            Am[g][4 * t + i], Am[g + 8][4 * t + i] = a[0][i], a[1][i]
            Am[g][16 + 4 * t + i], Am[g + 8][16 + 4 * t + i] = a[2][i], a[3][i]
        b = [bytes4(x) for x in B[l]]
        for i in range(4):
            Bm[4 * t + i][g], Bm[16 + 4 * t + i][g] = b[0][i], b[1][i]
    D = [[sum(Am[r][k] * Bm[k][c] for k in range(32)) for c in range(8)] for r in range(16)]
    for l in range(32):
        g, t = l >> 2, l & 3
        for i, (r, c) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
            C[l][i] = (C[l][i] + int(D[r][c])) & M32


def kslot_dim(kb, t, i):
    """Code k-block kb (0..7), lane t, byte i (hi slot 4t+i, lo slot 16+4t+i)."""
    return 32 * t + 4 * kb + i


def sslot(kb, t, e, i):
    """Sign k-block kb (0..3), lane t, half e (a0/a2), byte i -> (dim, bit position p)."""
    p = 2 * kb + e
    return 32 * t + 8 * i + p, p


def run(seed, G=4, qjl=True, peaky=False, mutate=None):
    rng = random.Random(seed)
    D = 128
    # keys: codes, signs, norms (as stored), queries already rotated and scaled
    codes = [[rng.randrange(8) for _ in range(D)] for _ in range(16)]
    if peaky:
        for row in codes:
            row[:8] = [7] * 8  # aligned with the query's large coordinates below
    signs = [[rng.randrange(2) for _ in range(D)] for _ in range(16)]
    nk = [rng.uniform(0.5, 20.0) for _ in range(16)]
    rk = [rng.uniform(0.05, 0.3) for _ in range(16)]
    kappa = math.sqrt(math.pi / 2) / D
    q = [[rng.gauss(0, 3.0) * (6 if peaky and d < 8 else 1) for d in range(D)] for _ in range(G)]
    sq = [[rng.gauss(0, 3.0) for _ in range(D)] for _ in range(G)]  # S q (the QJL side)

    S_k, _ = int_scale(C3)
    Ck = [int(round(c * S_k)) for c in C3]
    hk = [split16(c)[0] & 255 for c in Ck]
    lk = [split16(c)[1] & 255 for c in Ck]
    lut = (pack4(hk[:4]), pack4(hk[4:]), pack4(lk[:4]), pack4(lk[4:]))

    # prep: fixed-point queries and B fragments
    S_q = [CMAX / max(max(abs(x) for x in q[j]), 1e-30) for j in range(G)]
    sig = [max(max(abs(x) for x in sq[j]), 1e-30) for j in range(G)]
    Qi = [[int(round(q[j][d] * S_q[j] * 256)) for d in range(D)] for j in range(G)]
    # sign side: y = sq / sigma in [-1, 1]; the slot of bit position p (a u8
    # worth 2^p) holds Y = round(y 256 CMAX / 2^p): at least 17 bits
    def Ys(j, d, p):
        return int(round(sq[j][d] / sig[j] * 256 * CMAX / (1 << p)))

    def colq(g):
        return g >> 1, g & 1   # column g: query g / 2, part (0: hi | 0, 1: lo | hi)

    # code side: 24-bit query Q = 65536 hq + 256 mq + lq; key C = 256 hk + lk
    # in k-slots (hk of 4 codes | lk of the same 4 codes). Tile 0, column
    # 2j: (hq | 0), column 2j + 1: (mq | hq); tile 1, column 2j: (lq | mq),
    # column 2j + 1: zero (unused). Then 2^24 A + 2^16 B + 2^8 C = sum Q C - sum lq lk.
    Bc = {}
    for kb in range(8):
        for l in range(32):
            g, t = l >> 2, l & 3
            j, part = colq(g)
            if mutate == 'col':
                j, part = g & 3, g >> 2
            for tile in range(2):
                b0, b1 = [], []
                for i in range(4):
                    d = kslot_dim(kb, t, i)
                    if mutate == 'kslot':
                        d = 32 * t + 4 * kb + (i ^ 1)
                    hq, mq, lq = split24(Qi[j][d]) if j < G else (0, 0, 0)
                    lo_, hi_ = [(hq, 0), (mq, hq), (lq, mq), (0, 0)][2 * tile + part]
                    b0.append(lo_)
                    b1.append(hi_)
                Bc[kb, l, tile] = (pack4(b0), pack4(b1))
    # tile 0, column 2j: hi, 2j + 1: mid; tile 1, column 2j: lo, 2j + 1: zero
    Bs = {}
    for kb in range(4):
        for l in range(32):
            g, t = l >> 2, l & 3
            j, part = colq(g)
            for tile in range(2):
                regs = []
                for e in range(2):
                    v = []
                    for i in range(4):
                        d, p = sslot(kb, t, e, i)
                        if mutate == 'sslot':
                            p = 2 * kb + (1 - e)
                        parts = split24(Ys(j, d, p)) if j < G else (0, 0, 0)
                        v.append([parts[0], parts[1], parts[2], 0][2 * tile + part])
                    regs.append(pack4(v))
                Bs[kb, l, tile] = tuple(regs)

    # kernel: device-order words of each token row (kvq_layout.h: code 8k + i
    # in nibble i of word k, bit k of code 24 + i in bit 3 of that nibble)
    def words(tok, t):
        c = codes[tok][32 * t:32 * t + 32]
        return tuple(sum((c[8 * k + i] | ((c[24 + i] >> k) & 1) << 3) << (4 * i) for i in range(8))
                     for k in range(3))

    def sword(tok, t):
        return sum(int(signs[tok][32 * t + i]) << i for i in range(32))

    acc_c = [[MAGIC] * 4 for _ in range(32)]
    acc_c2 = [[MAGIC] * 4 for _ in range(32)]
    acc_s = [[[MAGIC] * 4 for _ in range(32)] for _ in range(2)]  # n-tiles 0, 1
    sel = {}
    for l in range(32):
        g, t = l >> 2, l & 3
        sel[l] = [sel32(*words(g, t)), sel32(*words(g + 8, t))]
    for kb in range(8):
        A = []
        for l in range(32):
            s0 = (sel[l][0][kb >> 1] >> (16 * (kb & 1))) & 0xFFFF
            s1 = (sel[l][1][kb >> 1] >> (16 * (kb & 1))) & 0xFFFF
            A.append((prmt(lut[0], lut[1], s0), prmt(lut[0], lut[1], s1),
                      prmt(lut[2], lut[3], s0), prmt(lut[2], lut[3], s1)))
        imma(acc_c, A, [Bc[kb, l, 0] for l in range(32)])
        imma(acc_c2, A, [Bc[kb, l, 1] for l in range(32)])
    if qjl:
        for kb in range(4):
            A = []
            for l in range(32):
                g, t = l >> 2, l & 3
                w0, w1 = sword(g, t), sword(g + 8, t)
                m0, m1 = 0x01010101 << (2 * kb), 0x01010101 << (2 * kb + 1)
                A.append((w0 & m0, w1 & m0, w0 & m1, w1 & m1))
            for tile in range(2):
                imma(acc_s[tile], A, [Bs[kb, l, tile] for l in range(32)], a_signed=False)

    # combination: lane (g, t) -> query t, tokens g and g + 8
    err = 0.0
    for l in range(32):
        g, t = l >> 2, l & 3
        if t >= G:
            continue
        for r, tok in enumerate((g, g + 8)):
            A0 = i2f_bits(acc_c[l][2 * r]) - MAGIC_F
            B0 = i2f_bits(acc_c[l][2 * r + 1]) - MAGIC_F
            C0 = i2f_bits(acc_c2[l][2 * r]) - MAGIC_F
            dot = ((A0 * 256.0 + B0) * 256.0 + C0) * 256.0 / (S_q[t] * 256 * S_k)
            s = dot
            if qjl:
                As = i2f_bits(acc_s[0][l][2 * r]) - MAGIC_F
                Bs_ = i2f_bits(acc_s[0][l][2 * r + 1]) - MAGIC_F
                Cs = i2f_bits(acc_s[1][l][2 * r]) - MAGIC_F
                P = ((As * 256.0 + Bs_) * 256.0 + Cs) / (256 * CMAX) * sig[t]  # sum over sign bit 1 of (S q)_j
                T = sum(sq[t])
                s += rk[tok] * kappa * (2 * P - T)
            s *= nk[tok]
            kf = [C3[c] for c in codes[tok]]
            dot_ref = sum(a * b for a, b in zip(q[t], kf))
            sgn_ref = sum(a * (2.0 * b - 1.0) for a, b in zip(sq[t], signs[tok]))
            ref = nk[tok] * (dot_ref + (rk[tok] * kappa * sgn_ref if qjl else 0.0))
            norm = lambda v: math.sqrt(sum(x * x for x in v))
            scale = nk[tok] * norm(q[t]) * norm(kf)
            err = max(err, abs(s - ref) / scale)
    return err


def main():
    S_k, e = int_scale(C3)
    print(f'codebook scale {S_k:.4f}: largest relative centroid error {e:.2e}')
    worst = 0.0
    for seed in range(6):
        for G in (1, 2, 3, 4):
            for qjl in (True, False):
                worst = max(worst, run(seed, G, qjl, peaky=seed % 2 == 1))
    print(f'worst score error / (|q| |k|): {worst:.2e}')
    assert worst < 2e-6, worst
    for m in ('col', 'kslot', 'sslot'):
        e = run(0, 4, True, mutate=m)
        print(f'mutation {m}: {e:.2e}')
        assert e > 1e-3, m
    print('ok')


if __name__ == '__main__':
    sys.exit(main())
