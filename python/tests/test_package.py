"""Where the package finds libkvcache.so: $KVCACHE_LIB first, then the copy
next to its modules (what `pip install ./python` ships), and a clear
ImportError when $KVCACHE_LIB names nothing loadable."""
import os
import shutil
import subprocess
import sys

import kvcache

PKG = os.path.dirname(os.path.abspath(kvcache.__file__))


def run_python(code, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("KVCACHE_LIB", "PYTHONPATH")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)


def test_the_library_next_to_the_package_is_found_without_kvcache_lib(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "kvcache", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(kvcache.lib_path, site / "kvcache" / "libkvcache.so")
    r = run_python("import kvcache; print(kvcache.lib_path); print(kvcache.price_per_token(32, 8, 128))",
                   {"PYTHONPATH": str(site)}, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path, price = r.stdout.split()
    assert os.path.samefile(path, site / "kvcache" / "libkvcache.so") and price == "131072"


def test_kvcache_lib_wins_and_a_bad_one_is_an_import_error(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "kvcache", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    r = run_python("import kvcache; print(kvcache.lib_path)",
                   {"PYTHONPATH": str(site), "KVCACHE_LIB": kvcache.lib_path}, cwd=str(tmp_path))
    assert r.returncode == 0 and os.path.samefile(r.stdout.strip(), kvcache.lib_path), r.stderr
    r = run_python("import kvcache", {"PYTHONPATH": str(site), "KVCACHE_LIB": str(tmp_path / "nope.so")},
                   cwd=str(tmp_path))
    assert r.returncode != 0 and "ImportError" in r.stderr and "KVCACHE_LIB=" in r.stderr
