#!/usr/bin/env python3
"""Plot `gpuipc bench --json` output: copy bandwidth against message size,
and the round trip with kernels in the loop beside its floors.

    gpuipc bench --json > bench.json
    python3 tools/bench_plot.py bench.json -o docs/bench.png [--title TEXT]

Copy bandwidth: one line per path (GPU a -> GPU b, or host) for gpuipc and a
dashed one for the baseline measured in the same run (cuMemcpyAsync on one
GPU, cuMemcpyPeerAsync between two, memcpy for host memory): the medians of
the alternated runs, the bars their spread (min-max). Where the run has
GPUs, a second panel: per path, the kernel-in-the-loop round trip through
gpuipc (kloop_gpuipc) next to its floors (kloop_one_process,
kloop_floor_word), medians with bars up to the p99. Then, where the run
has block rows, a panel of them: per path and block size, N scattered
blocks in one batch (blocks_gpuipc), one message a block
(blocks_per_message) and the one-process floors (blocks_floor: the
driver's batched copy; blocks_floor_kernel: gpuipc's block kernel),
medians of the rounds with bars from min to max. Needs matplotlib
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


def spread(rows, key):
    """Error bars from each median down to its min and up to its max (an
    output without the runs' spread gets none)."""
    if any(f"{key}_min" not in r for r in rows):
        return None
    return [[r[key] - r[f"{key}_min"] for r in rows],
            [r[f"{key}_max"] - r[key] for r in rows]]


def plot_bandwidth(ax, doc):
    for i, ((src, dst), rows) in enumerate(sorted(paths(doc).items())):
        rows.sort(key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rows]
        color = f"C{i % 10}"
        name = path_name(src, dst)
        ax.errorbar(x, [r["gpuipc_gbs"] for r in rows],
                    yerr=spread(rows, "gpuipc_gbs"), fmt="o-", color=color,
                    capsize=2, label=f"gpuipc, {name}")
        base = rows[0]["baseline"]
        if rows[0].get("peer_access") is not None:
            base += ", peer access " + ("on" if rows[0]["peer_access"] else "off")
        ax.errorbar(x, [r["baseline_gbs"] for r in rows],
                    yerr=spread(rows, "baseline_gbs"), fmt="s--", color=color,
                    alpha=0.6, capsize=2, label=f"{base}, {name}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r["bytes"] for r in doc["bandwidth"]})
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(t) for t in ticks], rotation=45)
    ax.set_xlabel("message size")
    ax.set_ylabel("GB/s (10^9 B/s)")
    runs = doc.get("runs")
    ax.set_title("copy bandwidth" + (f", medians of {runs} alternated runs"
                                     if runs else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


KLOOP_ROWS = ("kloop_gpuipc", "kloop_one_process", "kloop_floor_word")


def plot_kloop(ax, doc):
    by_path = {}
    for r in doc.get("kloop", []):
        by_path.setdefault((r["src"], r["dst"]), {})[r["row"]] = r
    keys = sorted(by_path)
    width = 0.8 / len(KLOOP_ROWS)
    for k, row in enumerate(KLOOP_ROWS):
        xs, med, up = [], [], []
        for i, key in enumerate(keys):
            r = by_path[key].get(row)
            if r is not None:
                xs.append(i + (k - 1) * width)
                med.append(r["median_us"])
                up.append(r["p99_us"] - r["median_us"])
        ax.bar(xs, med, width, yerr=[[0] * len(up), up], capsize=2,
               color=f"C{k}", label=row)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([path_name(s, d) for s, d in keys], rotation=45)
    ax.set_yscale("log")
    ax.set_ylabel("\u00b5s, median (bar to p99)")
    ax.set_title("4 KiB round trip, kernels in the loop", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


BLOCK_ROWS = ("blocks_gpuipc", "blocks_per_message", "blocks_floor",
              "blocks_floor_kernel")


def plot_blocks(ax, doc):
    groups = {}
    for r in doc.get("blocks", []):
        key = (r["src"], r["dst"], r["block_bytes"], r["n"])
        groups.setdefault(key, {})[r["row"]] = r
    keys = sorted(groups)
    width = 0.8 / len(BLOCK_ROWS)
    for k, row in enumerate(BLOCK_ROWS):
        xs, med, lo, hi = [], [], [], []
        for i, key in enumerate(keys):
            r = groups[key].get(row)
            if r is not None:
                xs.append(i + (k - (len(BLOCK_ROWS) - 1) / 2) * width)
                med.append(r["median_us"])
                lo.append(r["median_us"] - r["min_us"])
                hi.append(r["max_us"] - r["median_us"])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, color=f"C{k}",
               label=row)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{path_name(s, d)}\n{n} \u00d7 {size_label(b)}"
                        for s, d, b, n in keys], rotation=45)
    ax.set_yscale("log")
    ax.set_ylabel("\u00b5s until all is free, median (bar: min-max)")
    ax.set_title("scattered blocks of a paged cache", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


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

    panels = [plot_bandwidth]
    if doc.get("kloop"):
        panels.append(plot_kloop)
    if doc.get("blocks"):
        panels.append(plot_blocks)
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(6 * len(panels) + 2, 5), dpi=120)
    for ax, plot in zip(axes[0], panels):
        plot(ax, doc)
    names = ", ".join(d.get("name", f"GPU{d['ordinal']}")
                      for d in doc.get("devices", [])) or "host memory"
    fig.suptitle(args.title or f"gpuipc {doc.get('version', '')}, "
                 f"{doc.get('stream')} stream: {names}")
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
