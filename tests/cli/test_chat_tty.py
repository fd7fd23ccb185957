"""`kvcache chat` on a terminal (issue 45.2), driven through a pseudo-terminal
with Python's pty module: the banner, Ctrl-C stopping a reply while the
conversation goes on, Up recalling the last line (not sent as ^[[A), /help,
and Ctrl-D leaving on a line of its own. Runs KVCACHE_BIN on the real model
KVCACHE_CHAT_MODEL (make test-cli sets both)."""
import os
import pty
import re
import select
import signal
import time

import pytest

BIN = os.environ.get("KVCACHE_BIN", "build/kvcache")
MODEL = os.environ.get("KVCACHE_CHAT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")


class Tty:
    """The chat on a pseudo-terminal: everything it writes (stdout and stderr) in self.out."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(BIN, [BIN, "chat", "-m", MODEL, "-t", "2", *args])
        self.out = b""

    def expect(self, pattern, timeout=60.0, start=0):
        """Reads until pattern (a regex on bytes) matches self.out after start; the match."""
        end = time.time() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.out, start)
            if m:
                return m
            left = end - time.time()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout} s in:\n{self.out.decode(errors='replace')}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"chat ended before {pattern!r}:\n{self.out.decode(errors='replace')}")
                self.out += chunk

    def send(self, data):
        # libedit takes the terminal out of line mode just after it draws the
        # prompt; keys typed before that are echoed by the terminal itself
        time.sleep(0.3)
        os.write(self.fd, data)

    def wait(self, timeout=30.0):
        end = time.time() + timeout
        while time.time() < end:
            try:  # drain, so that the child never blocks on a full terminal
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    self.out += os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("chat did not exit:\n" + self.out.decode(errors="replace"))


@pytest.fixture
def chat():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} is missing (make model)")
    t = Tty("--temp", "0", "-n", "400")
    yield t
    try:
        os.kill(t.pid, signal.SIGKILL)
        os.waitpid(t.pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def test_ctrl_c_stops_the_reply_and_keeps_the_conversation_and_up_recalls_a_line(chat):
    chat.expect(rb"/help.*\n.*Ctrl-C stops a reply")   # the banner
    chat.expect(rb"> ")
    chat.send(b"Write a long story about a dragon who learns to bake bread.\r")
    start = len(chat.out)
    chat.expect(rb"\w+ \w+ \w+ \w+", start=start)     # the reply is under way
    chat.send(b"\x03")                                 # Ctrl-C
    chat.expect(rb"reply stopped by Ctrl-C", start=start)
    m = chat.expect(rb"\[turn 1: [^\]]*cache (\d+)/", start=start)
    held = int(m.group(1))
    chat.expect(rb"> ", start=m.end())
    # the conversation goes on: the next turn reuses every token the cache held
    start = len(chat.out)
    chat.send(b"/help\r")
    chat.expect(rb"/reset", start=start)
    chat.expect(rb"> ", start=start)
    start = len(chat.out)
    chat.send(b"Say hi.\r")
    m = chat.expect(rb"\[turn 2: prefilled \d+ new tokens \((\d+) reused", start=start, timeout=120)
    assert int(m.group(1)) >= held - 1, chat.out.decode(errors="replace")
    chat.expect(rb"> ", start=m.end())
    # Up recalls "Say hi." from the history: the model gets the line, not ^[[A
    start = len(chat.out)
    chat.send(b"\x1b[A")
    chat.expect(rb"Say hi\.", start=start)
    chat.send(b"\r")
    m = chat.expect(rb"\[turn 3: prefilled (\d+) new tokens", start=start, timeout=120)
    assert b"^[[A" not in chat.out[start:]
    chat.expect(rb"> ", start=m.end())
    # Ctrl-D on an empty line: exit 0, the terminal left on a new line
    start = len(chat.out)
    chat.send(b"\x04")
    assert chat.wait() == 0
    assert chat.out[start:].endswith(b"\n"), chat.out[start:]


def test_ctrl_c_at_the_prompt_discards_the_line_and_the_chat_goes_on(chat):
    chat.expect(rb"> ")
    start = len(chat.out)
    chat.send(b"half a thought")
    chat.expect(rb"half a thought", start=start)
    chat.send(b"\x03")
    chat.expect(rb"\^C", start=start)
    chat.expect(rb"> ", start=len(chat.out) - 2)
    start = len(chat.out)
    chat.send(b"/exit\r")
    assert chat.wait() == 0
    assert b"[turn" not in chat.out
