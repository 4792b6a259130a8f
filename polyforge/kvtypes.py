"""Bits per element of the KV cache types (block size in bits / elements per block)."""

from __future__ import annotations

# upstream ggml's
UPSTREAM_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5,
                 "q5_1": 6.0, "iq4_nl": 4.5}

# the chain's (0073): one fp16 norm per 64 values of 2, 3 or 4 bits
CHAIN_BITS = {"turbo2": 2.25, "turbo3": 3.25, "turbo4": 4.25}
