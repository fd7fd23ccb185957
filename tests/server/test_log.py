"""What kvcache serve says about itself (issue 45.7): a line on stderr per
request, as llama-server logs them, GET / naming the API, and a 404 that
points at the server rather than at a file in the source tree."""
import re
import time


def log_line(server, rid, timeout=10.0):
    """The stderr line of request rid (written just after its reply)."""
    end = time.time() + timeout
    while time.time() < end:
        for line in server.stderr().splitlines():
            if rid in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no log line for {rid} in:\n{server.stderr()}")


def test_each_request_logs_its_id_tokens_times_and_finish(server):
    status, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to ten."}],
                                                     "max_tokens": 5, "temperature": 0})
    assert status == 200, r
    line = log_line(server, r["id"])
    m = re.search(r" 200: prompt (\d+) tokens \((\d+) cached\), (\d+) generated, first token ([\d.]+) s, "
                  r"total ([\d.]+) s, finish (\w+)$", line)
    assert m, line
    assert int(m.group(1)) == r["usage"]["prompt_tokens"]
    assert int(m.group(2)) == r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(m.group(3)) == r["usage"]["completion_tokens"] == 5
    assert 0 < float(m.group(4)) <= float(m.group(5))
    assert m.group(6) == r["choices"][0]["finish_reason"] == "length"
    # the same prompt again: its prefix comes from the cache, and the line says so
    status, r2 = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to ten."}],
                                                      "max_tokens": 5, "temperature": 0, "stream": True},
                             headers={"Content-Type": "application/json"})
    assert status == 200
    rid = re.search(r'"id":\s*"([^"]+)"', r2).group(1)
    m = re.search(r"prompt (\d+) tokens \((\d+) cached\)", log_line(server, rid))
    assert m and int(m.group(2)) > 0, m


def test_root_says_what_this_is_and_where_the_api_is(server):
    status, r = server.get("/")
    assert status == 200
    assert r["name"] == "kvcache serve" and "POST /v1/chat/completions" in r["endpoints"]
    assert r["model"]


def test_404_points_at_the_server_not_the_source_tree(server):
    status, r = server.get("/v1/nothing")
    assert status == 404
    msg = r["error"]["message"]
    assert "/v1/nothing" in msg and "GET /" in msg and "docs/" not in msg
