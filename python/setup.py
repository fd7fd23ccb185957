"""Build step of `pip install ./python`: the package plus libkvcache.so.

The library is $KVCACHE_LIB when that is set; otherwise `make lib` runs in the
source tree this folder belongs to (python/..) and build/libkvcache.so is
copied next to the package's modules, where kvcache/_ffi.py looks first after
$KVCACHE_LIB. The wheel is marked platform-specific since it carries a .so."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def library():
    env = os.environ.get("KVCACHE_LIB")
    if env:
        return env
    if not os.path.exists(os.path.join(ROOT, "include", "kvcache.h")):
        raise SystemExit("kvcache: set KVCACHE_LIB=/path/to/libkvcache.so, or build from the source tree")
    subprocess.run(["make", "-C", ROOT, "lib"], check=True)
    return os.path.join(ROOT, "build", "libkvcache.so")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            shutil.copy2(library(), os.path.join(self.build_lib, "kvcache", "libkvcache.so"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
