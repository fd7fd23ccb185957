"""scripts/cluster.sh: three `kvcache serve` replicas behind HAProxy on
loopback. Which replica answered a request is read from the replicas' own
/metrics (the one whose prompt-token counter moved), never from HAProxy: the
requests of one X-Session-Id, one "session" field or one chat's first turn
land on one replica, whose prefix cache then hits; a replica killed with
SIGKILL costs no request after it."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import BIN, MODEL, ROOT, Server
from prom import parse, value

SYSTEM = ("You are a terse assistant for a hardware shop. Stock: "
          + "; ".join(f"bin {i} holds {i * 3} bolts" for i in range(1, 25)) + ".")


class Replica(Server):
    """A replica the script started: talks HTTP as Server does, owns no process."""
    def __init__(self, pid, url):
        self.pid, self.url = pid, url


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, n, *serve_args, env=None):
        port = free_port()
        self.proc = subprocess.Popen(["sh", os.path.join(ROOT, "scripts", "cluster.sh"), str(n), "--port", str(port),
                                      "--", *serve_args], stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "KVCACHE_BIN": BIN, "KVCACHE_SERVE_MODEL": MODEL, **(env or {})})
        self.replicas = []
        for line in self.proc.stdout:
            m = re.match(r"replica \d+ pid (\d+) (http://\S+)", line)
            if m:
                self.replicas.append(Replica(int(m.group(1)), m.group(2)))
            elif line.startswith("cluster "):
                self.front = Server.__new__(Server)
                self.front.url = line.split()[1]
                break
        assert len(self.replicas) == n and hasattr(self, "front"), "cluster.sh did not start"
        # every replica up in HAProxy's eyes: its checks run every 500 ms, two to rise
        time.sleep(1.5)

    def prompt_tokens(self):
        """Each live replica's kvcache_prompt_tokens_total (None for a dead one)."""
        out = []
        for r in self.replicas:
            try:
                out.append(value(r.metrics(), "kvcache_prompt_tokens_total"))
            except OSError:
                out.append(None)
        return out

    def chat(self, messages, headers=None, **fields):
        """(status, reply) of one greedy chat request through HAProxy."""
        body = {"model": "m", "messages": messages, "max_tokens": 4, "temperature": 0, **fields}
        return self.front.post("/v1/chat/completions", body, headers={"Content-Type": "application/json",
                                                                       **(headers or {})})

    def which(self, messages, headers=None, **fields):
        """The index of the replica that answered one request."""
        before = self.prompt_tokens()
        status, reply = self.chat(messages, headers, **fields)
        assert status == 200, reply
        for _ in range(200):   # the scheduler publishes its counters a moment after the reply
            moved = [i for i, (a, b) in enumerate(zip(before, self.prompt_tokens())) if a is not None and b != a]
            if moved:
                break
            time.sleep(0.01)
        assert len(moved) == 1, moved
        return moved[0]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.proc.stdout.close()
        assert rc == 0, f"cluster.sh exited {rc}"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(3, "-t", "1", "--parallel", "4", "--ctx", "1024")
    yield c
    c.stop()


def turns(first, *later):
    """A chat over SYSTEM whose first user turn is `first`, with later turns."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    for q in later:
        msgs += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": q}]
    return msgs


def test_session_header_sticks(cluster):
    seen = set()
    for k in range(6):
        sid = {"X-Session-Id": f"user-{k}"}
        first = cluster.which(turns(f"Hello from {k}"), sid)
        assert all(cluster.which(turns(f"Other text {k} {j}"), sid) == first for j in range(2))
        seen.add(first)
    assert len(seen) > 1, "six sessions all hashed to one replica"


def test_session_field_sticks(cluster):
    """The body's "session" routes too. These replicas keep no sessions
    (no --session-dir), so each such request is a 400: the replica whose
    400 counter moved is the one that got it."""
    def count_400():
        return [[v for n, lab, v in r.metrics()["kvcache_http_responses_total"]["samples"] if lab["code"] == "400"][0]
                for r in cluster.replicas]
    seen = set()
    for k in range(6):
        where = set()
        for j in range(3):
            before = count_400()
            assert cluster.chat(turns(f"Question {j} of {k}"), session=f"s{k}")[0] == 400
            for _ in range(100):   # counted once the reply is written
                moved = {i for i, (a, b) in enumerate(zip(before, count_400())) if b != a}
                if moved:
                    break
                time.sleep(0.01)
            where |= moved
        assert len(where) == 1, where
        seen |= where
    assert len(seen) > 1, "six sessions all hashed to one replica"


def test_chat_first_turn_sticks_and_hits(cluster):
    """Without a session, the later turns of a chat (which resend its start)
    go where its first turn went, and find that start in the prefix cache."""
    seen = set()
    for k in range(6):
        first = f"Which bin holds {k * 3 + 3} bolts?"
        where = cluster.which(turns(first))
        r = cluster.replicas[where]
        hits = value(r.metrics(), "vllm:prefix_cache_hits_total")
        assert cluster.which(turns(first, "And the next one?")) == where
        assert cluster.which(turns(first, "And the next one?", "Thanks. One more?")) == where
        assert value(r.metrics(), "vllm:prefix_cache_hits_total") - hits >= 2 * 200, "later turns missed the cache"
        seen.add(where)
    assert len(seen) > 1, "six chats all hashed to one replica"


def test_same_completion_prompt_sticks(cluster):
    body = {"model": "m", "prompt": "Once upon a time, in a shop of bolts and nuts,", "max_tokens": 2, "temperature": 0}
    before = cluster.prompt_tokens()
    for _ in range(3):
        assert cluster.front.post("/v1/completions", body)[0] == 200
    time.sleep(0.1)
    moved = [i for i, (a, b) in enumerate(zip(before, cluster.prompt_tokens())) if b != a]
    assert len(moved) == 1, moved


def test_killed_replica_costs_no_request(cluster):
    """Runs last in this module: SIGKILL the replica of a session, then that
    session and others keep being answered (by the replicas left)."""
    sid = {"X-Session-Id": "doomed"}
    victim = cluster.which(turns("Hello"), sid)
    os.kill(cluster.replicas[victim].pid, signal.SIGKILL)
    statuses = []
    for k in range(8):   # before and after HAProxy's checks notice (1 s)
        statuses.append(cluster.chat(turns(f"Still there? {k}"), sid)[0])
        statuses.append(cluster.chat(turns(f"Anyone? {k}"))[0])
        time.sleep(0.2)
    assert statuses == [200] * len(statuses)
