#!/usr/bin/env python3
"""Sums up bench/cuda_clock.sh: per shape, each kernel's duration and the SM
clock it ran at (GPC cycles elapsed / duration), medians over its launches.

    python3 bench/cuda_clock.py OUT/clock.csv OUT/clock.json
"""
import csv
import json
import statistics
import sys
from collections import defaultdict


def which(tag, name):
    """The row of the table a kernel belongs to, or None."""
    if tag == "sdpa":
        return "sdpa" if "flash_fwd" in name and "combine" not in name else None
    if "touch_kernel" in name:
        return "read"
    if "::fast_kernel<" in name or name.startswith("fast_kernel"):
        return tag
    return None


def main():
    src, dst = sys.argv[1], sys.argv[2]
    launches = defaultdict(dict)  # (row, batch, context, launch id) -> metrics
    for r in csv.reader(open(src)):
        if len(r) < 8 or r[3] == "ID":
            continue
        tag, b, n, f = r[0], int(r[1]), int(r[2]), r[3:]
        row = which(tag, f[4])
        if row:
            launches[(row, b, n, tag + f[0])][f[-3]] = float(f[-1].replace(",", ""))
    runs = defaultdict(lambda: defaultdict(list))
    for (row, b, n, _), m in launches.items():
        if "gpu__time_duration.sum" in m and "gpc__cycles_elapsed.avg.per_second" in m:
            ghz = m["gpc__cycles_elapsed.avg.per_second"] / 1e9
            us = m["gpu__time_duration.sum"] / 1e3
            runs[(b, n)][row].append((us, ghz, us * ghz * 1e3))
    out = []
    print("| shape | call kernel us | GHz | arithmetic alone us | GHz | copies alone us | GHz | plain read GHz "
          "| SDPA flash us | GHz | call / arithmetic, cycles |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (b, n), rows in sorted(runs.items()):
        med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in rows.items()}
        rec = {"batch": b, "context": n}
        for k, (us, ghz, cyc) in med.items():
            rec[k] = {"us": round(us, 2), "ghz": round(ghz, 3), "cycles": round(cyc), "launches": len(rows[k])}
        out.append(rec)

        def cell(k, i):
            return f"{med[k][i]:.{1 if i == 0 else 3}f}" if k in med else "-"

        ratio = f"{med['call'][2] / med['compute'][2]:.3f}" if "call" in med and "compute" in med else "-"
        print(f"| {b} x {n // 1024}K | {cell('call', 0)} | {cell('call', 1)} | {cell('compute', 0)} | "
              f"{cell('compute', 1)} | {cell('load', 0)} | {cell('load', 1)} | {cell('read', 1)} | "
              f"{cell('sdpa', 0)} | {cell('sdpa', 1)} | {ratio} |")
    json.dump({"results": out}, open(dst, "w"), indent=1)


if __name__ == "__main__":
    main()
