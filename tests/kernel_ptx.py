"""src/cuda/kernel.c ships its kernel as PTX text; src/cuda/copy_kernel.cu
is its source. So do `gpuipc bench`'s kernels: tools/bench_kernels.c, from
tools/bench_kernels.cu. This test compiles each source with nvcc and checks
that the PTX its C file carries is that output: the same instructions in
the same order, once comments, blank lines, spacing and the two header
lines that the C file lowers (.version 6.0, .target sm_60) are set aside.

  python3 tests/kernel_ptx.py NVCC SOURCE_DIR

Exits 77 (skipped) when NVCC is empty or missing, 1 with a diff when the two
disagree."""
import difflib
import os
import re
import subprocess
import sys
import tempfile

LOWERED = [".version 6.0", ".target sm_60"]

# (CUDA C source, the C file that carries its PTX, the string's name)
KERNELS = [
    ("src/cuda/copy_kernel.cu", "src/cuda/kernel.c", "copy_ptx"),
    ("tools/bench_kernels.cu", "tools/bench_kernels.c", "bench_ptx"),
]


def embedded_ptx(kernel_c, name):
    """The text of @kernel_c's @name string literal."""
    with open(kernel_c, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"static const char " + name +
                  r"\[\] =\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+);", text)
    if m is None:
        sys.exit(f"FAIL: no {name} string literal in {kernel_c}")
    out = []
    for lit in re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1)):
        out.append(bytes(lit, "utf-8").decode("unicode_escape"))
    return "".join(out)


def body(ptx):
    """(header lines, instruction lines): comments, blank lines and spacing
    left out; .version and .target apart."""
    head, lines = [], []
    for line in ptx.splitlines():
        line = line.split("//", 1)[0]
        line = " ".join(line.split())
        if not line:
            continue
        if line.startswith((".version", ".target")):
            head.append(line)
        else:
            lines.append(line)
    return head, lines


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    nvcc, src = sys.argv[1], sys.argv[2]
    if not nvcc or not os.access(nvcc, os.X_OK):
        print(f"SKIP: no nvcc ({nvcc or 'not found'}): the PTX is not checked")
        sys.exit(77)
    for cu, c_file, name in KERNELS:
        check(nvcc, os.path.join(src, cu), os.path.join(src, c_file), name)


def check(nvcc, cu, c_file, name):
    """Exit with a diff unless @c_file's @name is what @cu compiles to."""
    c_base, cu_base = os.path.basename(c_file), os.path.basename(cu)
    head, mine = body(embedded_ptx(c_file, name))
    if head != LOWERED:
        sys.exit(f"FAIL: {c_base}'s PTX header is {head}, expected {LOWERED}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "kernel.ptx")
        subprocess.run([nvcc, "-ptx", "-arch=compute_75", cu, "-o", out],
                       check=True)
        with open(out, encoding="utf-8") as f:
            _, theirs = body(f.read())
    if mine != theirs:
        diff = difflib.unified_diff(theirs, mine, f"nvcc -ptx {cu_base}",
                                    f"{c_base} {name}", lineterm="", n=2)
        print("\n".join(diff))
        sys.exit(f"FAIL: {c_base}'s PTX is not what {cu_base} compiles to")
    print(f"kernel_ptx: {c_base} ok ({len(mine)} lines agree)")


if __name__ == "__main__":
    main()
