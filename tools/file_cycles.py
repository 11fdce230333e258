#!/usr/bin/env python3
"""Which of libgpuipc's source files call each other in a ring, and which
calls go up the layers.

  tools/file_cycles.py [--expect FILE] OBJECT_DIR...

Reads the object files under each OBJECT_DIR with `nm`: file A depends on
file B when A uses a global symbol that B defines. An object whose source
file is no longer in the tree (a build folder keeps the objects of files
that moved or went) is skipped. Prints every cycle
(a strongly connected set of two or more files: each reaches every other)
with its size, and every dependency of a folder on a folder above it in
DESIGN.md's layers (core < os < wire < cuda < mem < domain < segment <
share < channel < mpi).

With --expect FILE (one cycle a line: its files, space-separated), the run
fails (exit 1) when a cycle appears that no line names or a named cycle
gains a file, and when any dependency goes up the layers; a cycle that
shrank or went away is reported, so that FILE can follow. Without it, the
exit status is 0 whatever it finds.
"""
import argparse
import os
import subprocess
import sys

# The tree this script belongs to (tools/..): where sources are looked for.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS = ["core", "os", "wire", "cuda", "mem", "domain", "segment", "share",
          "channel", "mpi"]


def source_name(obj):
    """src/domain/broker.c from .../src/domain/broker.c.o (CMake's names)."""
    path = obj[:-2] if obj.endswith(".o") else obj
    parts = path.split(os.sep)
    if "src" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("src"):]
    else:  # src/mpi's own target: .../src/mpi/CMakeFiles/x.dir/p2p.c.o
        parts = ["src", parts[-4] if len(parts) >= 4 else "?", parts[-1]]
    return "/".join(p for p in parts if not p.endswith(".dir")
                    and p != "CMakeFiles")


def symbols(obj):
    """(defined, undefined) global symbol sets of one object file."""
    out = subprocess.run(["nm", "-P", "-g", obj], check=True,
                         capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        (undefined if f[1] in ("U", "w", "v") else defined).add(f[0])
    return defined, undefined


def graph(dirs):
    objs = []
    for d in dirs:
        for root, _, files in os.walk(d):
            objs += [os.path.join(root, f) for f in files if f.endswith(".o")]
    owner, uses = {}, {}
    for o in sorted(objs):
        name = source_name(o)
        if not os.path.exists(os.path.join(ROOT, name)):
            continue  # left behind by a file that moved or went
        defined, undefined = symbols(o)
        for s in defined:
            owner[s] = name
        uses[name] = undefined
    edges = {n: set() for n in uses}
    for n, undefined in uses.items():
        for s in undefined:
            m = owner.get(s)
            if m is not None and m != n:
                edges[n].add(m)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components of two or more files."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(edges[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def layer(name):
    parts = name.split("/")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS \
        else None


def upward(edges):
    bad = []
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            la, lb = layer(a), layer(b)
            if la is not None and lb is not None and lb > la:
                bad.append((a, b))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--expect")
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    edges = graph(args.dirs)
    if not edges:
        sys.exit("file_cycles: no object files under " + " ".join(args.dirs))
    found = cycles(edges)
    print(f"{len(edges)} files, {sum(len(t) for t in edges.values())} "
          f"dependencies between files, {len(found)} cycle(s)")
    for c in found:
        print(f"cycle of {len(c)}: {' '.join(c)}")
    up = upward(edges)
    for a, b in up:
        print(f"up the layers: {a} -> {b}")
    if args.expect is None:
        return 0
    with open(args.expect, encoding="utf-8") as f:
        known = [set(line.split()) for line in f
                 if line.strip() and not line.startswith("#")]
    failed = bool(up)
    for c in found:
        home = [k for k in known if set(c) & k]
        if not home:
            print(f"NEW cycle: {' '.join(c)}")
            failed = True
        elif not set(c) <= set().union(*home):
            print(f"GREW: {' '.join(sorted(set(c) - set().union(*home)))} "
                  f"joined a known cycle")
            failed = True
    for k in known:
        if not any(set(c) >= k for c in found):
            print(f"shrank or gone (update {args.expect}): {' '.join(sorted(k))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
