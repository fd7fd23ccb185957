"""A model-based test through the binding: random sequences of new, remove,
fork, reserve + write, truncate and prefix_match on small caches (pages of 1
to 5 positions, pools of 3 to 19 pages, full and window caches) against a
plain Python model of each sequence's keys. After every operation each live
sequence must read back what the model holds, and now and then attend like the
numpy reference. As the prefix cache assumes, a position's K is a function of
the tokens up to it, so a page found by its tokens holds the right keys."""
import numpy as np
import pytest

import kvcache
import reference as ref
from kvcache import KVCacheError, Status

HKV, D = 1, 2


def key_row(tokens, pos):
    """K (= V) of position pos: a function of the token prefix tokens[:pos + 1]."""
    return [float(hash(tuple(tokens[:pos + 1])) % 1000003), float(pos)]


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_match_the_model(seed):
    rng = np.random.default_rng(seed)
    P, n_pages, W = int(rng.integers(1, 6)), int(rng.integers(3, 20)), int(rng.choice([0, 0, 3, 7]))
    c = kvcache.KVCache(HKV, D, page_size=P, n_pages=n_pages, max_seqs=4, window=W, max_seq_len=200)
    model = {}  # seq -> tokens; its keys are key_row(tokens, pos)
    for step in range(600):
        op, live = int(rng.integers(0, 7)), sorted(model)
        s = int(rng.choice(live)) if live else None
        if op == 0 or s is None:
            try:
                model[c.new_seq()] = []
            except KVCacheError as e:
                assert e.status == Status.ERR_SEQ
        elif op == 1:
            c.remove(s)
            del model[s]
        elif op == 2:
            try:
                model[c.fork(s)] = list(model[s])
            except KVCacheError as e:
                assert e.status == Status.ERR_SEQ
        elif op in (3, 4):
            toks = rng.integers(0, 3, int(rng.integers(1, 2 * P + 2))).tolist()
            before = c.stats()
            try:
                c.reserve(len(toks), s, tokens=toks)
            except KVCacheError as e:
                assert e.status in (Status.ERR_OUT_OF_PAGES, Status.ERR_CAPACITY)
                assert c.stats() == before and c.length(s) == len(model[s])
                continue
            allt = model[s] + toks
            k = np.array([key_row(allt, p) for p in range(len(model[s]), len(allt))]).reshape(1, -1, D)
            c.write(k, k, s)
            model[s] = allt
        elif op == 5:
            n = int(rng.integers(0, len(model[s]) + 1))
            try:
                c.truncate(n, s)
            except KVCacheError as e:
                assert e.status == Status.ERR_WINDOW and W > 0
                continue
            del model[s][n:]
        elif op == 6:
            try:
                new = c.new_seq()
            except KVCacheError:
                continue
            m = c.prefix_match(model[s], new)
            assert m % P == 0 and m <= len(model[s])   # a window: from its last W positions' pages
            model[new] = model[s][:m]
        for q, toks in model.items():
            L = len(toks)
            assert c.length(q) == L, (step, op)
            lo = 0 if W == 0 else max(0, L - W + 1)  # what the next query will see
            K, V = c.read(q, start=lo, n=L - lo)
            want = np.array([key_row(toks, p) for p in range(lo, L)]).reshape(1, -1, D)
            assert np.array_equal(K, want) and np.array_equal(V, want), (step, op, q)
        st = c.stats()
        assert st.pages_total == st.pages_used + st.pages_free + st.pages_cached
        if step % 7 == 0 and model:
            q = int(rng.choice(sorted(model)))
            L = len(model[q])
            if L and (W == 0 or op in (3, 4)):
                T = 1 if W else int(rng.integers(1, min(L, 4) + 1))
                qry = rng.standard_normal((2, T, D)) / 1000
                K = np.array([key_row(model[q], p) for p in range(L)]).reshape(1, L, D)
                try:
                    got = c.attend(qry, q)
                except KVCacheError as e:   # a window row whose keys went with a truncate
                    assert W > 0 and e.status == Status.ERR_WINDOW
                    continue
                np.testing.assert_allclose(got, ref.attention(qry, K, K, window=W), atol=1e-9)
