"""emulate_v3.py - a warp-level model of the third-pass fused-kernel path
(fast_kernel<..., TR = true> in cuda_attn_fast.cu, KVQ_CUDA_KERNEL_FAST_V3),
written before any device time to check its index arithmetic.

It models, lane by lane, what the kernel does per 16-token segment: the query
B fragments rebuilt from the prep kernel's A fragments, the K Q^T MMAs with
the decoded keys as A operand, the hi + lo exchange between lanes t and t ^ 2,
the lazy running max, the weights' hi/lo split and exchange, movmatrix, the
value MMA, and the epilogue's (m, l) and O merge. Fragment layouts are the
PTX ISA's (mma.m16n8k16, movmatrix.m8n8.trans); decoded codes are modelled as
f16 values in the slot order of the existing kernel (whose decoders were
checked on the device). check_current_layout() runs the current kernel's
score path through the same model, as a check of the model's conventions.
It compares against float64 attention and asserts a relative error < 1e-4.

    python3 tests/cuda/emulate_v3.py        (pure Python, ~1 s)

A model, not the kernel: tests/test_cuda.c on a GPU is the real check."""
import struct, random, math

def f16(x):
    return struct.unpack('<e', struct.pack('<e', x))[0]

def split(x):  # split_f16x2 for one value
    h = f16(x); return h, f16(x - h)

LANES = range(32)
def gt(l): return l >> 2, l & 3

def mma(C, A, B):
    """C[lane] = [c0..c3] += A (lane: 4 regs of 2 halves) x B (lane: 2 regs of 2 halves)."""
    Am = [[0.0] * 16 for _ in range(16)]; Bm = [[0.0] * 8 for _ in range(16)]
    for l in LANES:
        g, t = gt(l)
        a = A[l]
        Am[g][2*t], Am[g][2*t+1] = a[0]; Am[g+8][2*t], Am[g+8][2*t+1] = a[1]
        Am[g][2*t+8], Am[g][2*t+9] = a[2]; Am[g+8][2*t+8], Am[g+8][2*t+9] = a[3]
        b = B[l]
        Bm[2*t][g], Bm[2*t+1][g] = b[0]; Bm[2*t+8][g], Bm[2*t+9][g] = b[1]
    D = [[sum(Am[i][k] * Bm[k][j] for k in range(16)) for j in range(8)] for i in range(16)]
    for l in LANES:
        g, t = gt(l)
        C[l][0] += D[g][2*t]; C[l][1] += D[g][2*t+1]; C[l][2] += D[g+8][2*t]; C[l][3] += D[g+8][2*t+1]

def movm_trans(R):
    M = [[0.0] * 8 for _ in range(8)]
    for l in LANES:
        g, t = gt(l); M[g][2*t], M[g][2*t+1] = R[l]
    return [(M[2*gt(l)[1]][gt(l)[0]], M[2*gt(l)[1]+1][gt(l)[0]]) for l in LANES]

def shfl_xor(v, m): return [v[l ^ m] for l in LANES]
def ex2(x): return 0.0 if x == -math.inf else 2.0 ** x

def run(G, n_tok, seed, qjl=True):
    rnd = random.Random(seed)
    D = 128
    nseg = (n_tok + 15) // 16
    Q = [[rnd.gauss(0, 2) if q < G else 0.0 for _ in range(D)] for q in range(8)]
    QS = [[rnd.gauss(0, 1) if q < G else 0.0 for _ in range(D)] for q in range(8)]
    sig2 = [rnd.uniform(0.5, 2) if q < G else 0.0 for q in range(8)]
    tneg = [rnd.gauss(0, 1) if q < G else 0.0 for q in range(8)]
    kappa = 0.7
    T = nseg * 16
    Kc = [[f16(rnd.gauss(0, 1)) for _ in range(D)] for _ in range(T)]
    Ks = [[f16(rnd.choice([0.0, 1.0 / 8192, 1.0 / 2048, 2.0])) for _ in range(D)] for _ in range(T)]
    V = [[f16(rnd.gauss(0, 1)) for _ in range(D)] for _ in range(T)]
    nk = [f16(rnd.uniform(0.5, 3)) for _ in range(T)]
    rn = [f16(rnd.uniform(0.1, 1)) for _ in range(T)]
    nv = [f16(rnd.uniform(0.5, 2)) for _ in range(T)]
    # prep's A fragments qa[kb][lane] (validated layout of the current kernel)
    def afrag(M):
        out = []
        for kb in range(8):
            row = []
            for l in LANES:
                g, t = gt(l); s = kb * 16 + 2 * t
                hi = lambda x: split(x)[0]; lo = lambda x: split(x)[1]
                row.append(((hi(M[g][s]), hi(M[g][s+1])), (lo(M[g][s]), lo(M[g][s+1])),
                            (hi(M[g][s+8]), hi(M[g][s+9])), (lo(M[g][s+8]), lo(M[g][s+9]))))
            out.append(row)
        return out
    qa, sa = afrag(Q), afrag(QS)
    # TR prologue: qb[i] from qa as in the kernel (v.x, v.z) / (v.y, v.w)
    def bfrag(F):
        return [[(F[kb][((gt(l)[0] & 3) << 2) + (l & 3)][0], F[kb][((gt(l)[0] & 3) << 2) + (l & 3)][2]) if gt(l)[0] < 4
                 else (F[kb][((gt(l)[0] & 3) << 2) + (l & 3)][1], F[kb][((gt(l)[0] & 3) << 2) + (l & 3)][3])
                 for l in LANES] for kb in range(8)]
    qb, sb = bfrag(qa), bfrag(sa)
    # the B-fragment pairs the decoders give for token row (current kernel's kr layout)
    def kpair(M, tok, kb, t, second):
        s = kb * 16 + 2 * t + (8 if second else 0)
        return (M[tok][s], M[tok][s+1])
    m_run = [-math.inf] * 32; m_runb = [-math.inf] * 32; l_run = [0.0] * 32; l_runb = [0.0] * 32
    acc = [[[0.0] * 4 for _ in range(8)] for _ in LANES]  # acc[lane][mb][i]
    n_rescale = 0
    for seg in range(nseg):
        base = seg * 16
        sc = [[0.0] * 4 for _ in LANES]; ss = [[0.0] * 4 for _ in LANES]
        for kb in range(8):
            A = [(kpair(Kc, base + gt(l)[0], kb, gt(l)[1], 0), kpair(Kc, base + gt(l)[0] + 8, kb, gt(l)[1], 0),
                  kpair(Kc, base + gt(l)[0], kb, gt(l)[1], 1), kpair(Kc, base + gt(l)[0] + 8, kb, gt(l)[1], 1)) for l in LANES]
            mma(sc, A, qb[kb])
            if qjl:
                A = [(kpair(Ks, base + gt(l)[0], kb, gt(l)[1], 0), kpair(Ks, base + gt(l)[0] + 8, kb, gt(l)[1], 0),
                      kpair(Ks, base + gt(l)[0], kb, gt(l)[1], 1), kpair(Ks, base + gt(l)[0] + 8, kb, gt(l)[1], 1)) for l in LANES]
                mma(ss, A, sb[kb])
        u = [[0.0] * 4 for _ in LANES]
        for l in LANES:
            g, t = gt(l); qx = 2 * (t & 1)
            for r in range(2):
                tok = base + g + 8 * r
                rk = rn[tok] * kappa if qjl else 0.0
                for c in range(2):
                    i = 2 * r + c
                    u[l][i] = rk * sig2[qx + c] * ss[l][i] + sc[l][i] if qjl else sc[l][i]
        s = [[0.0] * 2 for _ in LANES]
        for c in range(2):
            x = shfl_xor([u[l][c] if gt(l)[1] >= 2 else u[l][2 + c] for l in LANES], 2)
            for l in LANES:
                g, t = gt(l); qx = 2 * (t & 1); own = base + g + 8 * (t >> 1)
                v = (u[l][2 + c] if t >= 2 else u[l][c]) + x[l]
                if qjl: v = rn[own] * kappa * tneg[qx + c] + v
                s[l][c] = v * nk[own]
        if base + 16 > n_tok:
            for l in LANES:
                g, t = gt(l)
                if base + g + 8 * (t >> 1) >= n_tok: s[l][0] = s[l][1] = -math.inf
        mx = [s[l][0] for l in LANES]; mxb = [s[l][1] for l in LANES]
        if any(mx[l] > m_run[l] or mxb[l] > m_runb[l] for l in LANES):
            n_rescale += 1
            for o in (2, 4, 8, 16):
                a1, b1 = shfl_xor(mx, o), shfl_xor(mxb, o)
                mx = [max(mx[l], a1[l]) for l in LANES]; mxb = [max(mxb[l], b1[l]) for l in LANES]
            for l in LANES:
                mn, mnb = max(m_run[l], mx[l]), max(m_runb[l], mxb[l])
                al = ex2(m_run[l] - mn) if mn > m_run[l] else 1.0
                alb = ex2(m_runb[l] - mnb) if mnb > m_runb[l] else 1.0
                l_run[l] *= al; l_runb[l] *= alb
                for mb in range(8):
                    acc[l][mb][0] *= al; acc[l][mb][1] *= alb; acc[l][mb][2] *= al; acc[l][mb][3] *= alb
                m_run[l], m_runb[l] = mn, mnb
        HB, LB = [], []
        for l in LANES:
            g, t = gt(l); own = base + g + 8 * (t >> 1)
            mu = 0.0 if m_run[l] == -math.inf else m_run[l]; mub = 0.0 if m_runb[l] == -math.inf else m_runb[l]
            p0, p1 = ex2(s[l][0] - mu), ex2(s[l][1] - mub)
            l_run[l] += p0; l_runb[l] += p1
            p0 *= nv[own]; p1 *= nv[own]
            (h0, lo0), (h1, lo1) = split(p0), split(p1)
            HB.append((h0, h1)); LB.append((lo0, lo1))
        xw = shfl_xor([HB[l] if gt(l)[1] >= 2 else LB[l] for l in LANES], 2)
        R0 = [xw[l] if gt(l)[1] >= 2 else HB[l] for l in LANES]
        R1 = [LB[l] if gt(l)[1] >= 2 else xw[l] for l in LANES]
        pb0, pb1 = movm_trans(R0), movm_trans(R1)
        B = [(pb0[l], pb1[l]) for l in LANES]
        for mb in range(8):  # value A fragment: V^T[slot][token] (current kernel's ldmatrix.trans result)
            A = []
            for l in LANES:
                g, t = gt(l); sl = mb * 16 + g
                vv = lambda slot, tok: V[base + tok][slot]
                A.append(((vv(sl, 2*t), vv(sl, 2*t+1)), (vv(sl+8, 2*t), vv(sl+8, 2*t+1)),
                          (vv(sl, 2*t+8), vv(sl, 2*t+9)), (vv(sl+8, 2*t+8), vv(sl+8, 2*t+9))))
            C = [acc[l][mb] for l in LANES]
            mma(C, A, B)
    # epilogue (TR): m/l of queries qx, qx+1 from lanes g == 0, t < 2; O as the current merge
    la, lb = l_run[:], l_runb[:]
    for o in (2, 4, 8, 16):
        xa, xb = shfl_xor(la, o), shfl_xor(lb, o)
        la = [la[l] + xa[l] for l in LANES]; lb = [lb[l] + xb[l] for l in LANES]
    ws_m = [None] * 4; ws_l = [None] * 4
    for l in LANES:
        g, t = gt(l)
        if g == 0 and t < 2:
            qx = 2 * (t & 1)
            ws_m[qx], ws_m[qx + 1], ws_l[qx], ws_l[qx + 1] = m_run[l], m_runb[l], la[l], lb[l]
    wo = [[None] * D for _ in range(4)]
    for mb in range(8):
        for i in range(4):
            o = [acc[l][mb][i] for l in LANES]; ox = shfl_xor(o, 2)
            for l in LANES:
                g, t = gt(l)
                if t < 2:
                    wo[2 * t + (i & 1)][mb * 16 + g + 8 * (i >> 1)] = o[l] + ox[l]
    worst = 0.0
    for q in range(G):
        sref = []
        for tok in range(n_tok):
            a = sum(Q[q][j] * Kc[tok][j] for j in range(D))
            z = sum(QS[q][j] * Ks[tok][j] for j in range(D))
            sref.append(nk[tok] * (a + (rn[tok] * kappa * (sig2[q] * z + tneg[q]) if qjl else 0.0)))
        M = max(sref)
        w = [2.0 ** (x - M) for x in sref]
        L = sum(w)
        ref = [sum(w[k] * nv[k] * V[k][j] for k in range(n_tok)) / L for j in range(D)]
        got = [wo[q][j] / ws_l[q] for j in range(D)]
        err = math.sqrt(sum((a - b) ** 2 for a, b in zip(got, ref)) / sum(b * b for b in ref))
        mdiff = abs(ws_m[q] - M)
        worst = max(worst, err)
        assert mdiff < 1e-3 * max(1.0, abs(M)), (q, ws_m[q], M)
    return worst, n_rescale, nseg

for (G, n, seed, qjl) in [(4, 77, 1, True), (4, 64, 2, True), (1, 33, 3, True), (3, 50, 4, False), (2, 16, 5, True),
                          (4, 1, 6, True), (4, 200, 7, True)]:
    e, nr, ns = run(G, n, seed, qjl)
    print(f"G={G} tokens={n:4d} qjl={qjl}: rel err {e:.2e}  (max reductions in {nr} of {ns} segments)")
    assert e < 1e-4
print("ok")

# Cross-check of the emulator's conventions on the current (device-validated)
# kernel's score path: S^T = Q K^T with qa as A and the key pairs as B; lane
# (g, t) must hold hi + lo of query g for tokens 2t, 2t+1 (c0 + c2, c1 + c3).
def check_current_layout(seed=11):
    rnd = random.Random(seed); D = 128
    Q = [[rnd.gauss(0, 2) for _ in range(D)] for q in range(8)]
    K = [[f16(rnd.gauss(0, 1)) for _ in range(D)] for _ in range(8)]
    qa = []
    for kb in range(8):
        row = []
        for l in LANES:
            g, t = gt(l); s = kb * 16 + 2 * t
            hi = lambda x: split(x)[0]; lo = lambda x: split(x)[1]
            row.append(((hi(Q[g][s]), hi(Q[g][s+1])), (lo(Q[g][s]), lo(Q[g][s+1])),
                        (hi(Q[g][s+8]), hi(Q[g][s+9])), (lo(Q[g][s+8]), lo(Q[g][s+9]))))
        qa.append(row)
    sc = [[0.0] * 4 for _ in LANES]
    for kb in range(8):
        B = [((K[gt(l)[0]][kb*16+2*gt(l)[1]], K[gt(l)[0]][kb*16+2*gt(l)[1]+1]),
              (K[gt(l)[0]][kb*16+2*gt(l)[1]+8], K[gt(l)[0]][kb*16+2*gt(l)[1]+9])) for l in LANES]
        mma(sc, qa[kb], B)
    for l in LANES:
        g, t = gt(l)
        for e in range(2):
            ref = sum(Q[g][j] * K[2*t+e][j] for j in range(D))
            assert abs(sc[l][e] + sc[l][e+2] - ref) < 1e-4 * (1 + abs(ref)), (l, e)
    print("current kernel's score layout reproduced by the emulator: ok")
check_current_layout()
