#!/usr/bin/env python3
"""Accuracy per bit: perplexity increase and KL divergence against bits per
value for every cache type family, with and without the recent-token f16
window, and with the window and key centering (--kv-center-k), on held-out
text (issue 25).

    python3 bench/frontier.py [--kvq BUILD/bin/kvq] [--model DIR] [--text FILE]
                              [--ctx 4096] [--windows 2] [--out docs/results/frontier] [--plot-only]

Each configuration is one `kvq ppl --kl-divergence --json` run (the f32 cache
of the same windows is the reference of both measures). Writes OUT.json (every
run), OUT-table.md (the table) and OUT.png (gnuplot; skipped with a line when
gnuplot is missing). Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

# (K, V, family). Families are plotted as one series each.
CONFIGS = [
    ("f16", "f16", "f16"),
    ("q8_0", "q8_0", "plain"), ("q8_0", "q4_0", "plain"), ("q4_0", "q4_0", "plain"), ("q5_0", "q5_0", "plain"),
    ("q8_0r", "q8_0r", "rotated"), ("q8_0r", "q4_0r", "rotated"), ("q4_0r", "q4_0r", "rotated"),
    ("q4_1r", "q4_1r", "rotated"), ("q5_0r", "q5_0r", "rotated"), ("q5_1r", "q5_1r", "rotated"),
    ("tq4j", "tq4", "tq"), ("tq4", "tq4", "tq"), ("tq4j", "tq3", "tq"), ("tq4", "tq3", "tq"),
    ("tq3j", "tq3", "tq"), ("tq3", "tq3", "tq"), ("tq4j", "tq2", "tq"), ("tq3j", "tq2", "tq"),
    ("tq2j", "tq2", "tq"), ("tq2", "tq2", "tq"),
    ("tq8", "tq8", "tq"), ("tq8", "tq6", "tq"), ("tq6", "tq6", "tq"), ("tq6", "tq5", "tq"), ("tq5", "tq5", "tq"),
    ("tq6", "tq4", "tq"), ("tq5", "tq4", "tq"), ("tq5", "tq3", "tq"), ("tq5", "tq2", "tq"), ("tq4", "tq2", "tq"),
]


def run(args, k, v, window, center=False):
    cmd = [args.kvq, "ppl", "--model", args.model, "--file", args.text, "--ctx", str(args.ctx),
           "--max-tokens", str(args.windows * (args.ctx - 1)), "-ctk", k, "-ctv", v, "--kl-divergence", "--json"]
    if not window:
        cmd.append("--no-kv-recent-f16")
    cmd.append("--kv-center-k" if center else "--no-kv-center-k")  # centring is on by default with the window
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit("frontier: %s failed: %s" % (" ".join(cmd), out.stderr.strip().splitlines()[-1:]))
    return json.loads(out.stdout)


def table(rows):
    lines = ["| K/V | window | centred keys | bits/value | ppl | Δppl | mean KL | p99 KL | top-1 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append("| %s/%s | %s | %s | %.3f | %.4f | %+.2f%% | %.5f | %.4f | %.2f%% |" % (
            r["k"], r["v"], "yes" if r["window"] else "no", "yes" if r.get("center") else "no", r["bits"], r["ppl"],
            r["dppl"], r["kl_mean"], r["kl_p99"], 100 * r["top1"]))
    return "\n".join(lines) + "\n"


def plot(rows, out, title):
    if not shutil.which("gnuplot"):
        print("frontier: gnuplot is not installed; no PNG")
        return
    dat = {}
    for r in rows:
        if r["bits"] > 9.5:  # f16: off the rate range drawn
            continue
        key = (r["family"], r["window"], bool(r.get("center")))
        dat.setdefault(key, []).append(r)
    files = []
    for (fam, win, ctr), rs in sorted(dat.items()):
        path = "%s-%s-%s%s.dat" % (out, fam, "win" if win else "nowin", "-ctr" if ctr else "")
        with open(path, "w") as f:
            for r in sorted(rs, key=lambda r: r["bits"]):
                f.write("%.4f %.5f %.6g %s/%s\n" % (r["bits"], max(r["dppl"], 0.01), max(r["kl_mean"], 1e-6),
                                                     r["k"], r["v"]))
        # The family's frontier by KL: the points no cheaper point beats.
        with open(path + ".front", "w") as f:
            best = float("inf")
            for r in sorted(rs, key=lambda r: r["bits"]):
                if r["kl_mean"] < best:
                    best = r["kl_mean"]
                    f.write("%.4f %.5f %.6g %s/%s\n" % (r["bits"], max(r["dppl"], 0.01), max(r["kl_mean"], 1e-6),
                                                         r["k"], r["v"]))
        files.append((fam, win, ctr, path))
    style = {"plain": ("pt 4", "gray40"), "rotated": ("pt 5", "red"), "tq": ("pt 7", "blue"), "f16": ("pt 9", "black")}
    gp = ["set terminal pngcairo size 1400,650 font ',10' noenhanced", "set output '%s.png'" % out,
          "set multiplot layout 1,2 title '%s'" % title, "set xlabel 'bits per cached value (window counted)'",
          "set logscale y", "set grid", "set key top right", "set xrange [2:9.5]",
          "set label 1 'lines: the frontier of each family (no cheaper pair has a lower KL); Δppl below 0.01% drawn at 0.01%'"
          " at screen 0.5, screen 0.015 center font ',8'", "set bmargin 5"]
    for panel, col, ylab in (("perplexity increase (%)", 2, "Δppl (%) vs the f32 cache"),
                             ("mean KL divergence", 3, "mean KL vs the f32 cache (nats)")):
        gp.append("set title '%s'" % panel)
        gp.append("set ylabel '%s'" % ylab)
        parts = []
        for fam, win, ctr, path in files:
            pt, color = style.get(fam, ("pt 1", "black"))
            if ctr:
                color = {"tq": "dark-cyan", "rotated": "orange"}.get(fam, color)
            parts.append("'%s' using 1:%d with points %s ps 1.0 lc rgb '%s' notitle" % (path, col, pt, color))
            parts.append("'%s.front' using 1:%d with linespoints %s ps 1.1 lc rgb '%s' dt %d title '%s%s%s'" % (
                path, col, pt, color, 1 if win else 2, fam, " + window" if win else "",
                " + centred keys" if ctr else ""))
            parts.append("'%s.front' using 1:%d:4 with labels offset 0,0.7 font ',7' tc rgb '%s' notitle" % (
                path, col, color))
        gp.append("plot " + ", \\\n     ".join(parts))
    gp.append("unset multiplot")
    script = out + ".gp"
    with open(script, "w") as f:
        f.write("\n".join(gp) + "\n")
    subprocess.run(["gnuplot", script], check=True)
    for _, _, _, path in files:
        os.remove(path)
        os.remove(path + ".front")
    os.remove(script)
    print("frontier: wrote %s.png" % out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvq", default="build/bin/kvq")
    ap.add_argument("--model", default="models/kvq-tiny-llama")
    ap.add_argument("--text", default="models/kvq-tiny-llama/reference/valid.txt")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--out", default="docs/results/frontier")
    ap.add_argument("--plot-only", action="store_true", help="redraw OUT.png from OUT.json")
    args = ap.parse_args()

    if args.plot_only:
        with open(args.out + ".json") as f:
            saved = json.load(f)
        meta, rows = saved["meta"], saved["rows"]
        plot(rows, args.out, "%s, %d tokens of %s at ctx %d: accuracy per bit (f32 cache ppl %.4f)" % (
            os.path.basename(meta["model"].rstrip("/")), meta["tokens"], os.path.basename(meta["text"]),
            meta["ctx"], meta["ref_ppl"]))
        return
    rows = []
    # centring: every family that compresses keys (f16 and the plain layouts
    # llama.cpp no longer uses by default are left out)
    modes = [(False, False, CONFIGS), (True, False, CONFIGS),
             (True, True, [c for c in CONFIGS if c[2] in ("tq", "rotated")])]
    total = sum(len(m[2]) for m in modes)
    t0 = time.time()
    for window, center, configs in modes:
        for k, v, fam in configs:
            j = run(args, k, v, window, center)
            kl = j["kl_vs_f32"]
            rows.append({"k": k, "v": v, "family": fam, "window": window, "center": center,
                         "bits": j["bits_per_value"],
                         "ppl": j["ppl"], "ref_ppl": kl["ref_ppl"], "dppl": 100 * (j["ppl"] / kl["ref_ppl"] - 1),
                         "kl_mean": kl["mean"], "kl_p99": kl["p99"], "top1": kl["top1_agreement"],
                         "tokens": j["scored"]})
            r = rows[-1]
            print("frontier: %2d/%d  %-12s %-8s %6.3f bits  ppl %+6.2f%%  KL %.5f  (%.0f s)" % (
                len(rows), total, k + "/" + v, ("win" if window else "") + ("+ctr" if center else ""), r["bits"],
                r["dppl"], r["kl_mean"], time.time() - t0), flush=True)
    meta = {"model": args.model, "text": args.text, "ctx": args.ctx, "windows": args.windows,
            "tokens": rows[0]["tokens"], "ref_ppl": rows[0]["ref_ppl"], "kvq": args.kvq}
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(args.out + "-table.md", "w") as f:
        f.write("%d tokens of %s in windows of %d; f32 cache ppl %.4f.\n\n" % (
            meta["tokens"], os.path.basename(args.text), args.ctx, meta["ref_ppl"]))
        f.write(table(rows))
    print(table(rows))
    plot(rows, args.out, "%s, %d tokens of %s at ctx %d: accuracy per bit (f32 cache ppl %.4f)" % (
        os.path.basename(args.model.rstrip("/")), meta["tokens"], os.path.basename(args.text), args.ctx,
        meta["ref_ppl"]))


if __name__ == "__main__":
    main()
