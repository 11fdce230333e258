#!/usr/bin/env python3
"""Plot `gpuipc bench --json` output: copy bandwidth against message size.

    gpuipc bench --json > bench.json
    python3 tools/bench_plot.py bench.json -o docs/bench.png [--title TEXT]

One line per path (GPU a -> GPU b, or host) for gpuipc and a dashed one for
the baseline measured in the same run (cuMemcpyAsync on one GPU,
cuMemcpyPeerAsync between two, memcpy for host memory). Needs matplotlib
(Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("schema") != 1:
        sys.exit(f"{path}: not `gpuipc bench --json` output of schema 1")
    return doc


def size_label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def paths(doc):
    out = {}
    for row in doc["bandwidth"]:
        key = (row["src"], row["dst"])
        out.setdefault(key, []).append(row)
    return out


def path_name(src, dst):
    return "host" if src < 0 else f"GPU{src} \u2192 GPU{dst}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="output of gpuipc bench --json")
    ap.add_argument("-o", "--output", default="bench.png")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    doc = load(args.json)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for i, ((src, dst), rows) in enumerate(sorted(paths(doc).items())):
        rows.sort(key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rows]
        color = f"C{i % 10}"
        name = path_name(src, dst)
        ax.plot(x, [r["gpuipc_gbs"] for r in rows], "o-", color=color,
                label=f"gpuipc, {name}")
        ax.plot(x, [r["baseline_gbs"] for r in rows], "s--", color=color,
                alpha=0.6, label=f"{rows[0]['baseline']}, {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r["bytes"] for r in doc["bandwidth"]})
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(t) for t in ticks], rotation=45)
    ax.set_xlabel("message size")
    ax.set_ylabel("GB/s (10^9 B/s)")
    names = ", ".join(d.get("name", f"GPU{d['ordinal']}")
                      for d in doc.get("devices", [])) or "host memory"
    ax.set_title(args.title or f"gpuipc {doc.get('version', '')} copy "
                 f"bandwidth, {doc.get('stream')} stream: {names}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
