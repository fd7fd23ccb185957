"""The documentation keeps up with the code: docs/API.md describes every
function include/kvcache.h declares, and docs/kvcache.1 every subcommand that
`kvcache --help` lists, and renders without warnings."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT
from test_abi import HEADER, declared_functions

API = os.path.join(ROOT, "docs", "API.md")
MAN = os.path.join(ROOT, "docs", "kvcache.1")
pytestmark = pytest.mark.skipif(not os.path.exists(HEADER) or not os.path.exists(API),
                                reason="no source tree")


def test_api_md_describes_every_public_function():
    text = open(API).read()
    missing = [f for f in declared_functions() if not re.search(rf"`{f}\b|\b{f}\(", text)]
    assert not missing, f"docs/API.md does not describe: {missing}"


def cli_binary():
    lib = os.environ.get("KVCACHE_LIB")
    for d in ([os.path.dirname(lib)] if lib else []) + [os.path.join(ROOT, "build")]:
        exe = os.path.join(d, "kvcache")
        if os.access(exe, os.X_OK):
            return exe
    return None


def test_man_page_documents_every_subcommand():
    exe = cli_binary()
    if exe is None:
        pytest.skip("no kvcache binary next to the library or in build/")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    subcommands = re.findall(r"^  (\w[\w-]*)\s", out, flags=re.M)
    assert subcommands, out
    man = open(MAN).read()
    missing = [c for c in subcommands if not re.search(rf"^\.SS {c}$", man, flags=re.M)]
    assert not missing, f"docs/kvcache.1 has no section for: {missing}"


@pytest.mark.skipif(not shutil.which("groff"), reason="groff is not installed")
def test_man_page_renders_without_warnings():
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", MAN], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_engine_api_md_describes_every_engine_function():
    from test_abi import engine_declared
    text = open(os.path.join(ROOT, "docs", "ENGINE_API.md")).read()
    missing = [f for f in engine_declared() if not re.search(rf"`{f}\b|\b{f}\(", text)]
    assert not missing, f"docs/ENGINE_API.md does not describe: {missing}"
