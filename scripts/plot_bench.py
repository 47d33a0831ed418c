#!/usr/bin/python3
"""Plot `trident bench comm --json` output (and peer figures) as busbw-vs-size PNGs, one per collective.

Usage:
  scripts/plot_bench.py [--out DIR] [--placement out|in|best] [--title-suffix TEXT] LABEL=FILE.json ...

Each LABEL=FILE pair is one source: a trident --json file (a JSON array of records with op, algo,
algo_forced, inplace, size, busbw, ...), or a peer file in the same shape (records with at least op, size,
busbw; optional algo). Every (label, algorithm) becomes one line: trident's forced algorithms as
"LABEL ring", "LABEL direct", ..., its automatic choice as "LABEL auto". A PNG per collective goes to DIR
(default docs/img) as busbw_<op>.png. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import collections
import json
import os
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):  # tolerate {"rows": [...]}
        data = data.get("rows", [])
    return data


def series_key(label, rec):
    algo = rec.get("algo")
    if algo is None or algo == label:
        return label
    if "algo_forced" in rec and not rec["algo_forced"]:
        return f"{label} auto"
    return f"{label} {algo}"


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:g}{unit}"
    return f"{n}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+", help="LABEL=FILE.json")
    ap.add_argument("--out", default="docs/img", help="output folder (default docs/img)")
    ap.add_argument("--placement", choices=["out", "in", "best"], default="best",
                    help="which trident run to plot per size: out-of-place, in-place, or the faster (default)")
    ap.add_argument("--title-suffix", default="", help="appended to each plot's title (e.g. the machine)")
    args = ap.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench.py needs matplotlib: apt-get install python3-matplotlib")

    # op -> series -> size -> busbw
    data = collections.defaultdict(lambda: collections.defaultdict(dict))
    for src in args.sources:
        if "=" not in src:
            sys.exit(f"source '{src}' is not LABEL=FILE.json")
        label, path = src.split("=", 1)
        for rec in load(path):
            op, size, busbw = rec.get("op"), rec.get("size", 0), rec.get("busbw")
            if op is None or busbw is None or size <= 0:
                continue
            if "inplace" in rec:
                if args.placement == "out" and rec["inplace"]:
                    continue
                if args.placement == "in" and not rec["inplace"]:
                    continue
            key = series_key(label, rec)
            prev = data[op][key].get(size)
            data[op][key][size] = busbw if prev is None else max(prev, busbw)

    if not data:
        sys.exit("no plottable records (need op, size > 0 and busbw)")
    os.makedirs(args.out, exist_ok=True)
    written = []
    for op in sorted(data):
        fig, ax = plt.subplots(figsize=(8, 5))
        for key in sorted(data[op]):
            pts = sorted(data[op][key].items())
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            style = "--" if key.endswith(" auto") else "-"
            ax.plot(xs, ys, style, marker="o", markersize=3, label=key)
        ax.set_xscale("log", base=2)
        ticks = sorted({s for series in data[op].values() for s in series})
        if len(ticks) > 12:
            step = (len(ticks) + 11) // 12
            ticks = ticks[::step]
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(t) for t in ticks], rotation=45)
        ax.set_xlabel("size (bytes, nccl-tests' definition)")
        ax.set_ylabel("busbw (GB/s, 1 GB = 1e9 B)")
        title = f"{op}: bus bandwidth"
        if args.title_suffix:
            title += f" ({args.title_suffix})"
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(args.out, f"busbw_{op}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    print("\n".join(written))


if __name__ == "__main__":
    main(sys.argv[1:])
