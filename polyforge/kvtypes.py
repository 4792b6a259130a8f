"""KV cache types: the bits per element of each (block size in bits / elements per block), and
the one spelling of a K/V pair, 'K/V' as -ctk/-ctv take them (bench --kv, gate params)."""

from __future__ import annotations

import re

# upstream ggml's
UPSTREAM_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5,
                 "q5_1": 6.0, "iq4_nl": 4.5}

# the chain's (0073): one fp16 norm per 64 values of 2, 3 or 4 bits
CHAIN_BITS = {"turbo2": 2.25, "turbo3": 3.25, "turbo4": 4.25}

_KV_PAIR = re.compile(r"([a-z0-9_]+)/([a-z0-9_]+)")


def kv_pair(text: object) -> tuple[str, str] | None:
    """'q8_0/q4_0' -> ('q8_0', 'q4_0'); None for anything else. A full match: with `^...$`,
    'q8_0/q4_0\\n' matched and its newline reached llama's argument list."""
    m = _KV_PAIR.fullmatch(text) if isinstance(text, str) else None
    return (m.group(1), m.group(2)) if m else None

# the one table of bits per element: upstream's KV types and the chain's
KV_BITS = {**UPSTREAM_BITS, **CHAIN_BITS}


def bits_per_pair(pair: str) -> float | None:
    """K + V bits per cached element ('q8_0/q4_0' -> 13.0); None for a type the table lacks."""
    k, v = pair.split("/")
    return KV_BITS[k] + KV_BITS[v] if k in KV_BITS and v in KV_BITS else None


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """a is no worse than b in every metric (lower is better) and better in one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
