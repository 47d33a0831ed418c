#!/usr/bin/python3
"""Plot `trident bench comm --json` output (and peer figures) as busbw-vs-size PNGs, one per collective.

Usage:
  scripts/plot_bench.py [--out DIR] [--placement out|in|best] [--title-suffix TEXT] LABEL=FILE.json ...

Each LABEL=FILE pair is one source: a trident --json file (a JSON array of records with op, algo,
algo_forced, inplace, size, busbw, ...), a peer file in the same shape (records with at least op, size,
busbw; optional algo), or a peer's own table as shared/peers/mpi_bench and gloo_bench print it (Gloo's
"allreduce_ring" rows become the line "LABEL ring"). Every (label, algorithm) becomes one line: trident's forced algorithms as
"LABEL ring", "LABEL direct", ..., its automatic choice as "LABEL auto". A PNG per collective goes to DIR
(default docs/img) as busbw_<op>.png. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import collections
import json
import os
import sys


# The peers' own tables (shared/peers/mpi_bench, gloo_bench): "NAME SIZE COUNT ITERS US_AVG US_MAX ALGBW BUSBW
# CHECK" per row, NAME a collective ("allreduce", "bcast", ...) or, for Gloo, collective_algorithm
# ("allreduce_new_ring").
PEER_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "bcast": "broadcast", "broadcast": "broadcast"}


def load_peer_table(f):
    recs = []
    for line in f:
        p = line.split()
        if len(p) != 9 or not p[1].isdigit():
            continue
        name, _, algo = p[0].partition("_")
        if name not in PEER_OPS:
            continue
        rec = {"op": PEER_OPS[name], "size": int(p[1]), "time_us": float(p[4]), "busbw": float(p[7])}
        if algo:
            rec["algo"] = algo
        recs.append(rec)
    return recs


def load(path):
    with open(path) as f:
        head = f.read(1)
        f.seek(0)
        if head not in "[{":  # a peer's table
            return load_peer_table(f)
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
                    help="which trident run to plot per size: out-of-place, in-place, or the faster (default); "
                         "a collective measured in one placement only (broadcast) is plotted as it is")
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
        recs = load(path)
        # Collectives run in one placement only (broadcast is in place only) keep it under --placement.
        placements = collections.defaultdict(set)
        for rec in recs:
            if "inplace" in rec:
                placements[rec.get("op")].add(bool(rec["inplace"]))
        for rec in recs:
            op, size, busbw = rec.get("op"), rec.get("size", 0), rec.get("busbw")
            if op is None or busbw is None or size <= 0:
                continue
            if "inplace" in rec and len(placements[op]) > 1:
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
        # One colour per line (tab20: no two lines share one up to 20), one marker per source.
        keys = sorted(data[op])
        colors = plt.get_cmap("tab20").colors
        sources = sorted({k.split(" ")[0] for k in keys})
        markers = "os^Dv<>p*h"
        for i, key in enumerate(keys):
            pts = sorted(data[op][key].items())
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            style = "--" if key.endswith(" auto") else "-"
            marker = markers[sources.index(key.split(" ")[0]) % len(markers)]
            ax.plot(xs, ys, style, marker=marker, markersize=3, color=colors[i % len(colors)], label=key)
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
