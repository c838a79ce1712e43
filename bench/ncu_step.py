#!/usr/bin/env python3
"""ncu_step.py - one decode step's kernels from Nsight Compute's CSV
(`ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,...`,
bench/decode_cuda.sh): per kernel name, launches, device time, DRAM bytes
and GB/s, sorted by time; the sum of kernel times against the step's wall
time is what the step spends between kernels.

    ncu_step.py NCU_LOG [--json OUT]
"""
import csv
import json
import re
import sys
from collections import defaultdict


def short(name):
    """A kernel's name without its argument list and namespaces."""
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"^void ", "", name)
    return name.split("::")[-1][:60]


def main():
    path = sys.argv[1]
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    wall = [l for l in lines if re.match(r"^(f16|tq3j|q\d)", l)]
    if start is None:
        print("ncu_step: no CSV in %s" % path)
        return 1
    per = defaultdict(lambda: {"n": 0, "ns": 0.0, "rd": 0.0, "wr": 0.0})
    seen = set()
    for row in csv.DictReader(lines[start:]):
        if "Kernel Name" not in row or not row.get("Metric Name"):
            continue
        k = short(row["Kernel Name"])
        key = (row["ID"], k)
        v = float(row["Metric Value"].replace(",", "") or 0)
        unit = row.get("Metric Unit", "")
        m = row["Metric Name"]
        if m == "gpu__time_duration.sum":
            scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
            per[k]["ns"] += v * scale
            if key not in seen:
                per[k]["n"] += 1
                seen.add(key)
        elif m.startswith("dram__bytes"):
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
            per[k]["rd" if "read" in m else "wr"] += v * scale
    tot = sum(p["ns"] for p in per.values())
    print("%-60s %6s %10s %10s %8s %6s" % ("kernel", "n", "us", "MB read", "GB/s", "%"))
    for k, p in sorted(per.items(), key=lambda kv: -kv[1]["ns"]):
        print("%-60s %6d %10.1f %10.2f %8.0f %5.1f%%" % (k, p["n"], p["ns"] / 1e3, p["rd"] / 1e6,
                                                        (p["rd"] + p["wr"]) / max(p["ns"], 1), 100 * p["ns"] / tot))
    n = sum(p["n"] for p in per.values())
    print("sum of %d kernels: %.3f ms device time" % (n, tot / 1e6))
    for l in wall:
        print("bench row (profiled run, one step under ncu): " + l)
    if "--json" in sys.argv:
        json.dump({"kernels": per, "sum_ms": tot / 1e6, "launches": n},
                  open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
