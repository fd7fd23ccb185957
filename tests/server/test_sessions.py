"""Sessions on disk in `kvcache serve --session-dir DIR`: the request field
"session" (the openai client sends it with extra_body) restores DIR/NAME.kvs
at admission and saves the sequence there when the request ends.

References are independent of the session code: a server started without
--session-dir (the shared `server` fixture) answering the same requests cold,
the openai client's own error classes, our strict Prometheus parser, and a
session file made by another model with `kvcache generate --session`."""
import os
import subprocess
import threading
import time

import openai
import pytest

from conftest import BIN, MODEL, ROOT, Server, check_tie, completion_steps

ARGS = ("-t", "2", "--parallel", "8", "--ctx", "2048", "--batch-tokens", "256")   # the `server` fixture's
SYSTEM = ("You are a careful assistant. Answer briefly. The inventory of the shop: "
          + "; ".join(f"shelf {i} holds {n} {t}" for i, (n, t) in enumerate(
              zip([3, 7, 12, 5, 9, 1, 4, 8, 6, 2] * 3,
                  ["lamps", "kettles", "violins", "scarves", "clocks", "globes", "cameras", "teapots", "maps",
                   "drums"] * 3), 1)) + ".")
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does shelf 4 hold?"}]
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf")


def client_of(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def metric(server, name, want=None):
    """A counter's value. The scheduler publishes its counters at the end of
    the step that answered a request, a moment after the reply: with `want`,
    wait (up to 2 s) for that value."""
    for _ in range(200):
        v = server.metrics()[name]["samples"][0][2]
        if want is None or v == want:
            break
        time.sleep(0.01)
    return v


def settle(server):
    """Waits until the published counters include every request answered."""
    for _ in range(200):
        m = server.metrics()
        if m["kvcache_requests_running"]["samples"][0][2] == 0 and m["kvcache_requests_waiting"]["samples"][0][2] == 0:
            return
        time.sleep(0.01)


def ask(server, messages, session=None, max_tokens=32, **kw):
    extra = {"session": session} if session is not None else None
    return client_of(server).chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                                     temperature=0, extra_body=extra, **kw)


def complete(server, prompt, session=None, max_tokens=24, **kw):
    extra = {"session": session} if session is not None else None
    return client_of(server).completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                extra_body=extra, **kw)


@pytest.fixture(scope="module")
def sess(tmp_path_factory):
    d = tmp_path_factory.mktemp("sessions")
    s = Server(*ARGS, "--session-dir", str(d))
    s.dir = d
    yield s
    s.stop()


def test_a_session_survives_a_restart_and_gives_the_text_of_a_server_without_sessions(server, tmp_path):
    first = Server(*ARGS, "--session-dir", str(tmp_path))
    try:
        r1 = ask(first, TURN1, session="chat-1")
        assert (tmp_path / "chat-1.kvs").is_file()
        assert metric(first, "kvcache_session_saves_total", 1) == 1
        assert metric(first, "kvcache_session_restores_total") == 0   # nothing to restore the first time
        assert r1.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        first.stop()
    assert sorted(os.listdir(tmp_path)) == ["chat-1.kvs"]   # no temporary file left behind
    # a copy for a conversation that leaves the file's tokens after the system prompt
    (tmp_path / "fork.kvs").write_bytes((tmp_path / "chat-1.kvs").read_bytes())
    fork = [TURN1[0], {"role": "user", "content": "What does shelf 8 hold?"}]
    turn2 = TURN1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And shelf 9?"}]
    second = Server(*ARGS, "--session-dir", str(tmp_path))   # a new process: an empty prefix cache
    try:
        n1 = r1.usage.prompt_tokens
        # only the common prefix is restored: the system prompt, not the question
        f = ask(second, fork, session="fork")
        forked = f.usage.prompt_tokens_details.cached_tokens
        assert 0 < forked < n1 - 3
        assert metric(second, "kvcache_session_restores_total", 1) == 1
        assert metric(second, "kvcache_prefix_cache_hits_total") == 0
        assert f.choices[0].message.content == ask(server, fork).choices[0].message.content
        # the next turn: at least the first turn's prompt comes from the file
        # (the prefix cache has the system prompt's pages now), not more than there is
        r2 = ask(second, turn2, session="chat-1")
        cached = r2.usage.prompt_tokens_details.cached_tokens
        assert n1 <= cached < r2.usage.prompt_tokens
        assert metric(second, "kvcache_session_restores_total", 2) == 2
        assert metric(second, "kvcache_session_restored_tokens_total", forked + cached) == forked + cached
        assert metric(second, "kvcache_session_load_failures_total", 0) == 0
        assert metric(second, "kvcache_session_io_seconds_total") > 0
        # the same text as a server that keeps no sessions
        cold1, cold2 = ask(server, TURN1), ask(server, turn2)
        assert r1.choices[0].message.content == cold1.choices[0].message.content
        assert r2.choices[0].message.content == cold2.choices[0].message.content
        assert r2.choices[0].finish_reason == cold2.choices[0].finish_reason
        assert r2.usage.completion_tokens == cold2.usage.completion_tokens
        # the file now holds the second turn too: a third turn, streamed, restores further
        turn3 = turn2 + [{"role": "assistant", "content": r2.choices[0].message.content},
                         {"role": "user", "content": "Which shelf holds drums?"}]
        chunks = list(ask(second, turn3, session="chat-1", stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == ask(server, turn3).choices[0].message.content
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= r2.usage.prompt_tokens
    finally:
        second.stop()


def test_completions_take_a_session_too(server, sess):
    prompt = SYSTEM + "\nQ: How many clocks are on shelf 5?\nA:"
    a = complete(sess, prompt, session="completion")
    assert (sess.dir / "completion.kvs").is_file()
    longer = prompt + a.choices[0].text + "\nQ: And on shelf 6?\nA:"
    settle(sess)
    before = metric(sess, "kvcache_session_saves_total")
    b = complete(sess, longer, session="completion")
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 16
    assert metric(sess, "kvcache_session_saves_total", before + 1) == before + 1
    assert a.choices[0].text == complete(server, prompt).choices[0].text
    assert b.choices[0].text == complete(server, longer).choices[0].text


BAD_NAMES = ["", "/", ".", "..", "a/b", "../x", "../../etc/passwd", ".hidden", "x" * 129, "a b", "a\\b", "caf\u00e9",
             "a\nb", "a:b", 5, 1.5, True, ["a"], {"name": "a"}]


@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n)[:20] for n in BAD_NAMES])
def test_bad_session_names_are_refused_with_400(sess, name):
    before = set(os.listdir(sess.dir))
    with pytest.raises(openai.BadRequestError) as e:
        ask(sess, TURN1, session=name, max_tokens=2)
    assert e.value.status_code == 400 and "'session'" in str(e.value)
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        complete(sess, "Hello", session=name, max_tokens=2)
    assert set(os.listdir(sess.dir)) == before
    assert not os.path.exists(os.path.join(os.path.dirname(sess.dir), "x.kvs"))


def test_good_session_names_are_files_in_the_directory(sess):
    for name in ("x" * 128, "A-b_c.9", "v1.2"):
        r = complete(sess, "Hello", session=name, max_tokens=2)
        assert r.choices[0].finish_reason in ("length", "stop")
        assert (sess.dir / f"{name}.kvs").is_file()


def test_a_session_on_a_server_without_session_dir_is_refused(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=TURN1, max_tokens=2, extra_body={"session": "a"})
    assert e.value.status_code == 400 and "--session-dir" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="Hi", max_tokens=2, extra_body={"session": "a"})
    # JSON null counts as absent, as for every field
    r = client.completions.create(model="m", prompt="Hi", max_tokens=2, extra_body={"session": None})
    assert r.usage.completion_tokens >= 1


def test_a_corrupt_truncated_or_foreign_session_file_gives_the_cold_text(server, sess, tmp_path):
    """Each case has a prompt of its own ("Case K. ..."), which the session
    server has never seen, so its prefix cache has nothing and the file is
    read; the good files to damage come from a second server."""
    short = "The shop has lamps, kettles, violins, scarves, clocks, globes, cameras and teapots on ten shelves."
    question = "\nQ: Which shelf holds teapots?\nA:"
    helper = Server(*ARGS, "--session-dir", str(tmp_path / "helper"))
    foreign = tmp_path / "gemma.kvs"   # made by another model
    out = subprocess.run([BIN, "generate", "-m", GEMMA, "-p", short, "-n", "2", "-t", "2", "--ctx", "2048",
                          "--session", str(foreign)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and foreign.is_file(), out.stderr

    def truncated(b): return b[: len(b) // 3]
    def cut_by_a_byte(b): return b[:-1]
    def one_byte_more(b): return b + b"\0"
    def flipped_kv_bit(b): return b[: len(b) // 2] + bytes([b[len(b) // 2] ^ 0x10]) + b[len(b) // 2 + 1:]
    def flipped_token_id(b): return b[:200] + bytes([b[200] ^ 0x01]) + b[201:]   # the engine header's ids
    def empty(b): return b""
    def noise(b): return os.urandom(5000)
    def another_model(b): return foreign.read_bytes()
    damage = [None, truncated, cut_by_a_byte, one_byte_more, flipped_kv_bit, flipped_token_id, empty, noise,
              another_model]
    try:
        for k, harm in enumerate(damage):
            what = harm.__name__ if harm else "undamaged"
            prefix = f"Case {k}. {short}"
            complete(helper, prefix, session=f"case-{k}", max_tokens=2)
            good = (tmp_path / "helper" / f"case-{k}.kvs").read_bytes()
            assert len(good) > 100000
            (sess.dir / f"case-{k}.kvs").write_bytes(harm(good) if harm else good)
            settle(sess)
            failures = metric(sess, "kvcache_session_load_failures_total")
            restored = metric(sess, "kvcache_session_restored_tokens_total")
            r = complete(sess, prefix + question, session=f"case-{k}", max_tokens=20, logprobs=2)
            cold = complete(server, prefix + question, max_tokens=20, logprobs=2).choices[0]
            if harm:   # refused: prefilled as the cold run is, the same text
                assert r.choices[0].text == cold.text, what
            elif r.choices[0].text != cold.text:   # restored: the prefix came by another chunking
                check_tie(what, completion_steps(r.choices[0]), completion_steps(cold))
            cached = r.usage.prompt_tokens_details.cached_tokens
            if harm:
                assert metric(sess, "kvcache_session_load_failures_total", failures + 1) == failures + 1, what
                assert metric(sess, "kvcache_session_restored_tokens_total") == restored and cached == 0, what
            else:   # the control: the same file whole restores the prefix
                assert cached > 20
                assert metric(sess, "kvcache_session_restored_tokens_total", restored + cached) == restored + cached
            # the run saved a good file in its place
            assert (sess.dir / f"case-{k}.kvs").read_bytes()[:8] == b"KVCSESS1"
    finally:
        helper.stop()


def test_concurrent_requests_with_and_without_sessions_give_their_solo_texts(server, sess):
    prompts = [SYSTEM + f"\nQ: What does shelf {i} hold?\nA:" for i in (2, 3, 11, 17, 23, 29)]
    for i in (0, 1):   # two of the sessions have a file to restore from
        complete(sess, SYSTEM, session=f"conc-{i}", max_tokens=3)
    solo = [complete(server, p, max_tokens=24).choices[0].text for p in prompts]
    got, errors = {}, []

    def one(k, session):
        try:
            got[k] = complete(sess, prompts[k % len(prompts)], session=session, max_tokens=24).choices[0].text
        except Exception as e:   # the assertion below names it
            errors.append(e)
    jobs = [(k, f"conc-{k}" if k < 4 else None) for k in range(len(prompts))]
    jobs += [(len(prompts), "same"), (len(prompts) + 1, "same")]   # two at once on one name
    ts = [threading.Thread(target=one, args=j) for j in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for k, _ in jobs:
        assert got[k] == solo[k % len(prompts)], k
    # two requests on one name: the last to finish wrote the file, whole
    r = complete(sess, prompts[0] + solo[0], session="same", max_tokens=4)
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    assert not [f for f in os.listdir(sess.dir) if not f.endswith(".kvs")]   # no temporary files


def test_a_session_dir_that_cannot_be_used_is_refused_at_start(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("not a directory")
    for arg, rc, says in ((str(afile), 1, "not a directory"), ("", 2, "--session-dir"),
                          (str(afile / "below"), 1, "cannot make it")):
        out = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--session-dir", arg], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == rc and says in out.stderr, (arg, out.returncode, out.stderr)
    # a missing directory is made
    out_dir = tmp_path / "new"
    s = Server("-t", "2", "--session-dir", str(out_dir))
    try:
        assert out_dir.is_dir()
        complete(s, "Hello", session="a", max_tokens=2)
        assert (out_dir / "a.kvs").is_file()
    finally:
        s.stop()
