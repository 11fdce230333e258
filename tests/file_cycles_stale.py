"""tools/file_cycles.py reads a build folder, which keeps the objects of
source files that have since moved or gone: those must not count. This
test builds two objects in a folder laid out as CMake lays out
gpuipc_obj's: src/channel/send.c's (a file that exists) defining a symbol,
and src/core/gone_for_this_test.c's (a file that does not) using it -- a
call up the layers, were the stale object read. The tool must see one file
and pass.

  python3 tests/file_cycles_stale.py CC SOURCE_DIR"""
import os
import subprocess
import sys
import tempfile


def compile_obj(cc, src_text, obj):
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    c = obj[:-2]
    with open(c, "w", encoding="utf-8") as f:
        f.write(src_text)
    subprocess.run([cc, "-c", c, "-o", obj], check=True)
    os.unlink(c)


def main():
    cc, root = sys.argv[1], sys.argv[2]
    gone = "src/core/gone_for_this_test.c"
    if os.path.exists(os.path.join(root, gone)):
        sys.exit(f"FAIL: {gone} exists: the test needs a file that does not")
    with tempfile.TemporaryDirectory() as tmp:
        objdir = os.path.join(tmp, "CMakeFiles", "gpuipc_obj.dir")
        compile_obj(cc, "int file_cycles_stale_sym(void) { return 1; }\n",
                    os.path.join(objdir, "src", "channel", "send.c.o"))
        compile_obj(cc, "int file_cycles_stale_sym(void);\n"
                        "int file_cycles_stale_use(void)\n"
                        "{ return file_cycles_stale_sym(); }\n",
                    os.path.join(objdir, gone + ".o"))
        expect = os.path.join(tmp, "known")
        with open(expect, "w", encoding="utf-8") as f:
            f.write("# none\n")
        r = subprocess.run([sys.executable,
                            os.path.join(root, "tools", "file_cycles.py"),
                            "--expect", expect, objdir],
                           capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode != 0:
        sys.exit(f"FAIL: file_cycles.py exits {r.returncode} on a folder "
                 f"whose only other object's source ({gone}) is gone")
    if not r.stdout.startswith("1 files,"):
        sys.exit("FAIL: file_cycles.py counted the stale object")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
