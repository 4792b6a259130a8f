"""polyforge.kvtypes: the one K/V pair spelling (bench --kv, perplexity-kld params)."""

from __future__ import annotations

import pytest

from polyforge.bench.matrix import BenchSpec
from polyforge.errors import BadInput
from polyforge.gates import perplexity_kld
from polyforge.kvtypes import CHAIN_BITS, UPSTREAM_BITS, kv_pair


def test_kv_pair():
    assert kv_pair("q8_0/turbo3") == ("q8_0", "turbo3")
    for bad in ("q8_0", "q8_0/q4_0\n", "q8_0/q4_0/f16", "Q8_0/q4_0", " q8_0/q4_0", "", None, 5):
        assert kv_pair(bad) is None, bad


def test_bench_and_the_kld_gate_spell_pairs_alike():
    with pytest.raises(BadInput, match="not a K/V type pair"):
        BenchSpec.make(["q8_0"], None, [0], None, [0], 16, 1)
    assert perplexity_kld.kv_pair is kv_pair  # the gate's params are checked by the same function


def test_no_type_is_both_upstream_and_the_chains():
    assert not set(UPSTREAM_BITS) & set(CHAIN_BITS)
