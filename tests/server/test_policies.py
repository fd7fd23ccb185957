"""The cache policies in `kvcache serve`: --context-shift / --keep and
--draft-lookup, through the openai client and curl, against a plain server
and against `kvcache generate` (the one generation loop, which applies the
same library shift to a single sequence)."""
import json
import subprocess

import pytest

from conftest import BIN, MODEL, Server

CTX = 256
# a list to copy: prompt lookup has something to draft, and the answer runs past the context
LIST = "\n".join(f"{i}. The {c} {t} from {p}." for i, (c, t, p) in enumerate(
    zip(["red", "blue", "green", "white", "black", "silver", "orange", "purple"] * 2,
        ["lamp", "kettle", "violin", "scarf", "clock", "globe", "camera", "teapot"] * 2,
        ["Oslo", "Lima", "Riga", "Quito", "Hanoi", "Perth", "Dakar", "Sofia", "Tunis", "Accra", "Osaka",
         "Cusco", "Berlin", "Dublin", "Nairobi", "Lisbon"]), 1))
PROMPT = f"Inventory:\n{LIST}\n\nThe same inventory, copied line by line:\n1."


@pytest.fixture(scope="module")
def servers():
    plain = Server("-t", "2", "--parallel", "2", "--ctx", str(CTX))
    policy = Server("-t", "2", "--parallel", "2", "--ctx", str(CTX), "--context-shift", "--keep", "8",
                    "--draft-lookup", "8")
    yield plain, policy
    plain.stop()
    policy.stop()


def metric(server, name):
    return server.metrics()[name]["samples"][0][2]


def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_context_shift_runs_past_the_context_as_the_generation_loop_does(servers):
    plain, policy = servers
    n_prompt = len(plain.post("/tokenize", {"content": PROMPT})[1]["tokens"])
    assert 100 < n_prompt < CTX - 50
    want = 2 * CTX
    a = client(plain).completions.create(model="m", prompt=PROMPT, max_tokens=want, temperature=0)
    b = client(policy).completions.create(model="m", prompt=PROMPT, max_tokens=want, temperature=0)
    # without the policy the sequence ends when the context is full
    assert a.choices[0].finish_reason == "length" and a.usage.completion_tokens < want
    assert a.usage.prompt_tokens + a.usage.completion_tokens <= CTX + 1
    # with it, it goes on well past the context (unless the model ends its turn)
    assert b.usage.completion_tokens > CTX or b.choices[0].finish_reason == "stop"
    assert b.usage.completion_tokens > a.usage.completion_tokens
    assert b.choices[0].text.startswith(a.choices[0].text[:-8])   # the same tokens until the shift
    assert metric(policy, "kvcache_context_shifts_total") >= 1
    # the library's shift on one sequence, in the one generation loop: the same text
    tokens = plain.post("/tokenize", {"content": PROMPT, "add_special": True})[1]["tokens"]
    assert len(tokens) in (n_prompt, n_prompt + 1)
    out = subprocess.run([BIN, "generate", "-m", MODEL, "-p", PROMPT, "--temp", "0", "-n", str(want), "-t", "2",
                          "--ctx", str(CTX), "--context-shift", "--keep", "8"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "shift" in out.stderr
    assert out.stdout.rstrip("\n") == b.choices[0].text.rstrip("\n")


def test_context_shift_through_curl_streams_to_the_end(servers):
    _, policy = servers
    body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": CTX + 40, "temperature": 0, "stream": True})
    out = subprocess.run(["curl", "-sN", "-H", "Content-Type: application/json", "-d", body,
                          policy.url + "/v1/completions"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0
    events = [json.loads(line[6:]) for line in out.stdout.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert out.stdout.rstrip().endswith("data: [DONE]")
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finishes) == 1
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    whole = client(policy).completions.create(model="m", prompt=PROMPT, max_tokens=CTX + 40, temperature=0)
    assert text == whole.choices[0].text and finishes[0] == whole.choices[0].finish_reason


def test_prompt_lookup_gives_the_text_of_the_plain_server(servers):
    plain, policy = servers
    before = (metric(policy, "kvcache_draft_tokens_total"), metric(policy, "kvcache_draft_accepted_total"))
    msgs = [{"role": "user", "content": f"{LIST}\n\nRepeat the list above exactly."}]
    for max_tokens in (45, 7):   # prompt (204 tokens) + reply within the context: no shift on either
        a = client(plain).chat.completions.create(model="m", messages=msgs, max_tokens=max_tokens, temperature=0)
        b = client(policy).chat.completions.create(model="m", messages=msgs, max_tokens=max_tokens, temperature=0)
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.choices[0].finish_reason == b.choices[0].finish_reason
        assert a.usage.completion_tokens == b.usage.completion_tokens
    # two at once: their drafts and decodes share steps
    import threading
    res = {}

    def one(k, srv):
        res[k] = client(srv).chat.completions.create(model="m", messages=msgs, max_tokens=45, temperature=0,
                                                     stop=["9."] if k[1] else None).choices[0].message.content
    ts = [threading.Thread(target=one, args=((srv_i, stop), srv)) for srv_i, srv in enumerate(servers)
          for stop in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert res[(0, 0)] == res[(1, 0)] and res[(0, 1)] == res[(1, 1)]
    drafted = metric(policy, "kvcache_draft_tokens_total") - before[0]
    accepted = metric(policy, "kvcache_draft_accepted_total") - before[1]
    assert 0 < accepted <= drafted
    assert metric(plain, "kvcache_draft_tokens_total") == 0


def test_sampled_requests_do_not_draft(servers):
    _, policy = servers
    before = metric(policy, "kvcache_draft_tokens_total")
    r = client(policy).completions.create(model="m", prompt=PROMPT, max_tokens=20, temperature=0.9, seed=3)
    assert r.usage.completion_tokens >= 1
    assert metric(policy, "kvcache_draft_tokens_total") == before


def test_bad_policy_options_are_refused():
    for args in (["--draft-lookup", "65"], ["--draft-lookup", "-1"], ["--keep", "-2"]):
        out = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", *args], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and " ".join(args) in out.stderr, out.stderr   # the bad option, named
