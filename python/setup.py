"""Build step of `pip install ./python`: the package plus libkvcache.so and
libkvengine.so (kvcache.Model).

The libraries are $KVCACHE_LIB and $KVCACHE_ENGINE_LIB when those are set;
otherwise the source tree this folder belongs to (python/..) builds them
portable: `make BUILD=build-portable MARCH=` compiles the generic code for
plain x86-64 (no -march=native), and the SIMD kernels, compiled for their own
instruction sets, are chosen at run time by CPU feature (KVCACHE_SIMD forces
one). So the wheel runs on any x86-64, with AVX2 or AVX-512 where the CPU has
them. The libraries are copied next to the package's modules, where
kvcache/_ffi.py and kvcache/_engine.py look first after the variables. The
wheel is marked platform-specific since it carries .so files."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PORTABLE = os.path.join(ROOT, "build-portable")


def libraries():
    """{file name in the package: path} of the two libraries."""
    env = {"libkvcache.so": os.environ.get("KVCACHE_LIB"), "libkvengine.so": os.environ.get("KVCACHE_ENGINE_LIB")}
    if all(env.values()):
        return env
    if not os.path.exists(os.path.join(ROOT, "include", "kvcache.h")):
        raise SystemExit("kvcache: set KVCACHE_LIB=/path/to/libkvcache.so and KVCACHE_ENGINE_LIB=/path/to/"
                         "libkvengine.so, or build from the source tree")
    targets = [os.path.join("build-portable", name) for name, path in env.items() if not path]
    subprocess.run(["make", "-C", ROOT, "BUILD=build-portable", "MARCH=", *targets], check=True)
    return {name: path or os.path.join(PORTABLE, name) for name, path in env.items()}


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            for name, path in libraries().items():
                shutil.copy2(path, os.path.join(self.build_lib, "kvcache", name))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
