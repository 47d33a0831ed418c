#!/usr/bin/env python3
"""Plot scaling curves written by `trident simulate --sweep strong|weak|both --csv FILE`.

  trident simulate --model gpt2-124m --gpu a100-80gb --gpus 512 --gpus-per-node 1 --inter-link eth-100g \
      --global-batch 512 --tp 1 --pp 1 --algo ring --sweep both --csv /tmp/ddp.csv
  python3 scripts/plot_scaling.py /tmp/ddp.csv:ddp-100GbE [more.csv:label ...] --out scaling.png

One figure with step time (strong scaling), throughput and scaling efficiency against the GPU count.
matplotlib is optional: without it (e.g. a pyenv python; try /usr/bin/python3 after
`apt-get install python3-matplotlib`) the script prints the table and exits 0.
"""
import argparse
import csv
import sys


def load(spec):
    path, _, label = spec.partition(":")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return label or path, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="FILE[:LABEL] from trident simulate --csv")
    ap.add_argument("--out", default="scaling.png", help="PNG to write")
    args = ap.parse_args()
    series = [load(s) for s in args.csv]
    for label, rows in series:
        for r in rows:
            print(f"{label:20s} {r['mode']:6s} gpus={int(r['gpus']):6d} step={float(r['step_time_s']):.4f}s "
                  f"tokens/s={float(r['tokens_per_s']):.0f} eff={100 * float(r['efficiency']):.1f}%")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: table only (install python3-matplotlib and run with /usr/bin/python3)",
              file=sys.stderr)
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label, rows in series:
        for mode, style in (("strong", "-o"), ("weak", "--s")):
            pts = [r for r in rows if r["mode"] == mode]
            if not pts:
                continue
            g = [int(r["gpus"]) for r in pts]
            axes[0].plot(g, [float(r["step_time_s"]) for r in pts], style, label=f"{label} {mode}")
            axes[1].plot(g, [float(r["tokens_per_s"]) for r in pts], style, label=f"{label} {mode}")
            axes[2].plot(g, [100 * float(r["efficiency"]) for r in pts], style, label=f"{label} {mode}")
    titles = ("step time (s)", "tokens / s", "scaling efficiency (%)")
    for ax, t in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_title(t)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("trident simulate: scaling")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
