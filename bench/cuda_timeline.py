#!/usr/bin/env python3
"""Sums up the per-block times of one fused-kernel launch.

Input: timeline_<batch>_<context>.txt files written by bench_cuda from a
measurement build (make MEASURE=-DKVQ_CU_MEASURE_TIMELINE, then
KVQ_BENCH_TIMELINE=dir KVQ_BENCH_PROFILE=1 ...). One block per line: start,
queries ready (after the wait for the prep kernel), first stage of warp 0 in
shared memory, first warp out of the main loop, warps merged, end
(%globaltimer ns, low 56 bits), the SM in the top 8 bits of the last word.

Per file it prints the launch span, block durations, the wait for the first
stage, and the slot utilisation: the summed block time over span x slots,
slots being the most blocks resident at once. Idle slot time is split into
what lies after a slot's last block (the tail) and the rest.

    python3 bench/cuda_timeline.py OUT/timeline_8_131072.txt ...
"""
import statistics
import sys

MASK = (1 << 56) - 1


def load(path):
    blocks = []
    with open(path) as f:
        for line in f:
            w = [int(x) for x in line.split()]
            if len(w) == 6:
                blocks.append(tuple(x & MASK for x in w) + (w[5] >> 56,))
    return blocks


def pct(sorted_vals, p):
    return sorted_vals[min(len(sorted_vals) - 1, int(p * len(sorted_vals)))]


def summary(path):
    b = load(path)
    if not b:
        return f"{path}: no blocks"
    t0 = min(x[0] for x in b)
    t1 = max(x[5] for x in b)
    span = (t1 - t0) / 1e3
    dur = sorted((x[5] - x[0]) / 1e3 for x in b)
    queries = sorted((x[1] - x[0]) / 1e3 for x in b)
    first = sorted((x[2] - x[0]) / 1e3 for x in b if x[2])
    merge = sorted((x[5] - x[4]) / 1e3 for x in b)
    wspread = sorted((x[4] - x[3]) / 1e3 for x in b)
    # most blocks resident at once = slots
    ev = sorted([(x[0], 1) for x in b] + [(x[5], -1) for x in b])
    cur = slots = 0
    for _, d in ev:
        cur += d
        slots = max(slots, cur)
    per_sm = {}
    for x in b:
        per_sm.setdefault(x[6], []).append(x)
    sm_slots = slots / len(per_sm)
    tail = 0.0
    for v in per_sm.values():
        ends = sorted((x[5] - t0) / 1e3 for x in v)[-round(sm_slots):]
        tail += sum(span - e for e in ends)
    busy = sum(dur)
    idle = span * slots - busy
    lines = [
        f"{path}: {len(b)} blocks on {len(per_sm)} SMs, {slots} slots; span {span:.1f} us",
        f"  block us: median {statistics.median(dur):.1f}, min {dur[0]:.1f}, max {dur[-1]:.1f}; "
        f"queries after {statistics.median(queries):.2f} us, first stage after {statistics.median(first):.2f} us "
        f"(medians); first to last warp out of the loop {statistics.median(wspread):.2f} us, "
        f"merge + write {statistics.median(merge):.2f} us",
        f"  slot utilisation {busy / (span * slots):.3f}; idle slot time {idle / slots:.1f} us per slot, "
        f"{tail / slots:.1f} of it after the slot's last block",
        "  block ends (us from the first start), 0/10/50/90/100%: "
        + " ".join(f"{pct(sorted((x[5] - t0) / 1e3 for x in b), p):.1f}" for p in (0, 0.1, 0.5, 0.9, 1.0)),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        print(summary(p))
