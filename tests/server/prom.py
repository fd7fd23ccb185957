"""A strict parser of the Prometheus text exposition format (0.0.4), written
for the tests: every sample must belong to a family declared by # TYPE, names
and labels must be well-formed, values must be numbers, and a histogram's
buckets must be cumulative with +Inf equal to _count."""
import math
import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"^({NAME})(\{{(.*)\}})? (\S+)$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse(text):
    """{family: {"type": t, "samples": [(name, labels dict, value)]}}; raises ValueError."""
    fams, cur = {}, None
    assert text.endswith("\n"), "the page must end with a newline"
    for ln in text.splitlines():
        if not ln.strip():
            continue
        if ln.startswith("# HELP "):
            continue
        if ln.startswith("# TYPE "):
            parts = ln.split()
            if len(parts) != 4 or parts[3] not in TYPES or not re.fullmatch(NAME, parts[2]):
                raise ValueError(f"bad TYPE line {ln!r}")
            if parts[2] in fams:
                raise ValueError(f"family {parts[2]} declared twice")
            cur = parts[2]
            fams[cur] = {"type": parts[3], "samples": []}
            continue
        if ln.startswith("#"):
            continue
        m = SAMPLE.match(ln)
        if not m:
            raise ValueError(f"bad sample line {ln!r}")
        name, labels_s, value_s = m.group(1), m.group(3), m.group(4)
        labels, rest = {}, labels_s or ""
        while rest:
            lm = LABEL.match(rest)
            if not lm:
                raise ValueError(f"bad labels in {ln!r}")
            labels[lm.group(1)] = lm.group(2)
            rest = rest[lm.end():]
        value = float(value_s)   # raises on garbage; "+Inf"/"NaN" parse
        fam = cur
        if fam is None or not (name == fam or (fams[fam]["type"] == "histogram" and
                                               name in (fam + "_bucket", fam + "_sum", fam + "_count"))):
            raise ValueError(f"sample {name} outside its family ({fam})")
        fams[fam]["samples"].append((name, labels, value))
    for fam, f in fams.items():
        if f["type"] != "histogram":
            continue
        buckets = [(float(l["le"]), v) for n, l, v in f["samples"] if n == fam + "_bucket"]
        count = [v for n, _, v in f["samples"] if n == fam + "_count"]
        if not buckets or buckets[-1][0] != math.inf or len(count) != 1:
            raise ValueError(f"histogram {fam} lacks +Inf or _count")
        if any(b[0] >= c[0] or b[1] > c[1] for b, c in zip(buckets, buckets[1:])):
            raise ValueError(f"histogram {fam} buckets not ascending and cumulative")
        if buckets[-1][1] != count[0]:
            raise ValueError(f"histogram {fam}: +Inf bucket != _count")
    return fams


def value(fams, name):
    """The one sample of a gauge or counter family."""
    s = fams[name]["samples"]
    assert len(s) == 1, name
    return s[0][2]
