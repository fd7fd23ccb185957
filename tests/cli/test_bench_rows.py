"""`kvcache bench model` prints each row as soon as it is measured (issue
45.3), as llama-bench does: the first row is on stdout while the later ones
are still running."""
import os
import subprocess
import time

import pytest

BIN = os.environ.get("KVCACHE_BIN", "build/kvcache")
MODEL = os.environ.get("KVCACHE_CHAT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_the_first_row_comes_before_the_run_ends():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is missing (make model)")
    # the second depth prefills 1024 tokens untimed, then runs 3 more prefills of 64:
    # seconds of work after the first row
    p = subprocess.Popen([BIN, "bench", "model", "-m", MODEL, "-t", "2", "-p", "16,64", "-n", "0",
                          "--depth", "0,1024", "-r", "3"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    try:
        rows, t_first = [], None
        for line in p.stdout:
            if line.lstrip().startswith("prefill"):
                rows.append(line)
                t_first = t_first or time.monotonic()
        assert p.wait(timeout=300) == 0
        # buffered, every row would come at exit, within milliseconds of the end
        assert time.monotonic() - t_first > 0.5, "the first row came only when the run ended"
        assert [r.split()[1:3] for r in rows] == [["16", "d0"], ["64", "d0"], ["16", "d1024"], ["64", "d1024"]]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
