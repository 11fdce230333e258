"""Builds gpuipc._gpuipc against CPython's limited API (one abi3 binary for
every CPython >= 3.9) and, beside it in the package, the shared library
libgpuipc.so.1 from libgpuipc's C sources (src/*/*.c but src/mpi), as
CMake builds the library: -D_GNU_SOURCE, src/libgpuipc.map's exports, and
GPUIPC_HAVE_CUDA=1 when cuda.h is found (CUDA_HOME, CUDA_PATH,
/usr/local/cuda/include, /usr/include). The extension is linked to that
library (RUNPATH $ORIGIN), not compiled with it: a process that also loads
libgpuipc (ctypes on gpuipc.libgpuipc_path(), a C extension) has one copy
of gpuipc's state. The sources are looked for in GPUIPC_SOURCE_DIR, else
the repository around this directory. The package's version is the
library's: include/gpuipc.h's GPUIPC_VERSION_* macros (which CMake checks
against its project(VERSION)), so that pip and gpuipc.__version__ say the
same."""
import glob
import os
import re

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

here = os.path.dirname(os.path.abspath(__file__))
root = os.environ.get("GPUIPC_SOURCE_DIR") or os.path.dirname(here)
if not os.path.exists(os.path.join(root, "include", "gpuipc.h")):
    raise SystemExit(f"gpuipc's C sources not found in {root}: set GPUIPC_SOURCE_DIR")


def header_version():
    """"MAJOR.MINOR.PATCH" from include/gpuipc.h's GPUIPC_VERSION_* macros."""
    with open(os.path.join(root, "include", "gpuipc.h"), encoding="utf-8") as f:
        text = f.read()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define GPUIPC_VERSION_%s (\d+)$" % part, text, re.M)
        if m is None:
            raise SystemExit(f"include/gpuipc.h has no GPUIPC_VERSION_{part}")
        parts.append(m.group(1))
    return ".".join(parts)


def cuda_include():
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if base and os.path.exists(os.path.join(base, "include", "cuda.h")):
            return os.path.join(base, "include")
    for d in ("/usr/local/cuda/include", "/usr/include"):
        if os.path.exists(os.path.join(d, "cuda.h")):
            return d
    return None


sources = sorted(p for p in glob.glob(os.path.join(root, "src", "*", "*.c"))
                 if os.sep + "mpi" + os.sep not in p)
cuda = cuda_include()
includes = [os.path.join(root, "include"), os.path.join(root, "src")]
if cuda and cuda != "/usr/include":
    includes.append(cuda)

# setuptools takes an extension's sources only relative to this directory.
os.chdir(here)
version = header_version()
SONAME = "libgpuipc.so.%s" % version.split(".")[0]
macros = [("_GNU_SOURCE", None), ("GPUIPC_HAVE_CUDA", "1" if cuda else "0")]


class build_ext_with_library(build_ext):
    """Builds libgpuipc.so.N into the package's directory first, then the
    extension linked to it."""

    def build_extension(self, ext):
        pkg = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(pkg, exist_ok=True)
        lib = os.path.join(pkg, SONAME)
        objects = self.compiler.compile(
            sources, output_dir=os.path.join(self.build_temp, "libgpuipc"), include_dirs=includes,
            macros=macros + [("GPUIPC__VERSION_STRING", '"%s"' % version)],
            extra_postargs=["-std=gnu11", "-fPIC", "-fvisibility=hidden",
                            "-Wno-unused-parameter"])
        self.compiler.link_shared_object(
            objects, lib, libraries=["dl", "pthread"],
            extra_postargs=["-Wl,-soname," + SONAME, "-Wl,--no-undefined",
                            "-Wl,--version-script=" + os.path.join(root, "src", "libgpuipc.map")])
        ext.library_dirs = [pkg]
        ext.libraries = [":" + SONAME]
        super().build_extension(ext)


# The extension's own files: the module and its neighbours by concern
# (gpuipc/_gpuipc.h lists them).
module_sources = sorted(glob.glob(os.path.join("gpuipc", "_gpuipc*.c")))
ext = Extension(
    "gpuipc._gpuipc",
    sources=module_sources,
    depends=[os.path.join("gpuipc", "_gpuipc.h")] + [os.path.relpath(p, here) for p in sources],
    include_dirs=includes,
    define_macros=macros + [("Py_LIMITED_API", "0x03090000")],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wno-unused-parameter"],
    extra_link_args=["-Wl,-rpath,$ORIGIN"],
    libraries=["dl"],
    py_limited_api=True,
)

setup(version=version, ext_modules=[ext], cmdclass={"build_ext": build_ext_with_library},
      options={"bdist_wheel": {"py_limited_api": "cp39"}})
