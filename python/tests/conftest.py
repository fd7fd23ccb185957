"""Shared fixtures. The binding is imported from PYTHONPATH (make test sets
PYTHONPATH=python and KVCACHE_LIB=build/libkvcache.so)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def weights(rng, D, H, Hkv, d, dtype=np.float64):
    """Seed-style projections: Wq [D, H*d], Wk and Wv [D, Hkv*d], scaled by 1/8."""
    return tuple((rng.standard_normal((D, n * d)) / 8).astype(dtype) for n in (H, Hkv, Hkv))
