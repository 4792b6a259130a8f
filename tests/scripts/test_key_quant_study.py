"""scripts/key_quant_study.py: the facts its study rests on, on synthetic data.

The pair scale is exact (it commutes with RoPE), the smooth scale is the SmoothQuant alpha = 0.5 choice,
the rotation is orthonormal, and the numpy turbo quantizer keeps each block's norm with centroid values.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "key_quant_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("key_quant_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pair_scale_commutes_with_rope(study):
    rng = np.random.default_rng(0)
    d, n = 64, 40
    q = rng.standard_normal((n, 1, d)).astype(np.float32)
    k = rng.standard_normal((n, 1, d)).astype(np.float32)
    pos = np.arange(n) * 37
    s_half = rng.uniform(0.2, 5.0, d // 2).astype(np.float32)
    s = np.concatenate([s_half, s_half])            # channels i and i + d/2 share a scale
    logits = np.einsum("td,ud->tu", study.rope_neox(q, pos, 1e4)[:, 0], study.rope_neox(k, pos, 1e4)[:, 0])
    scaled = np.einsum("td,ud->tu", study.rope_neox(q * s, pos, 1e4)[:, 0], study.rope_neox(k / s, pos, 1e4)[:, 0])
    np.testing.assert_allclose(scaled, logits, rtol=1e-4, atol=1e-3)

    # a scale that differs inside a pair does not commute
    s_bad = np.concatenate([s_half, s_half[::-1]])
    bad = np.einsum("td,ud->tu", study.rope_neox(q * s_bad, pos, 1e4)[:, 0], study.rope_neox(k / s_bad, pos, 1e4)[:, 0])
    assert np.abs(bad - logits).max() > 1e-1


def test_smooth_scale_is_alpha_half(study):
    rng = np.random.default_rng(1)
    d, n = 32, 256
    k_rms = rng.uniform(0.1, 10.0, d // 2)
    q_rms = rng.uniform(0.1, 10.0, d // 2)
    k = rng.standard_normal((n, d)) * np.concatenate([k_rms, k_rms])
    q = rng.standard_normal((n, 1, d)) * np.concatenate([q_rms, q_rms])
    cfg = study.parse_config("turbo3:scale=smooth,calib=0")
    s = study.key_scale(cfg, k.astype(np.float32), q.astype(np.float32))
    expected = np.sqrt(k_rms / q_rms)
    ratio = s / expected
    assert np.std(ratio) / np.mean(ratio) < 0.15    # proportional to sqrt(rms_k / rms_q), up to sampling
    assert study.key_scale(study.parse_config("turbo3"), k.astype(np.float32), q.astype(np.float32)) is None


def test_hadamard_is_orthonormal(study):
    for n in (64, 128, 256):
        h = study.hadamard(n).astype(np.float64)
        np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-6)


def _is_scaled_codebook(row, codebook):
    """Some block scale d makes every value of the row a codebook entry (d from the first value)."""
    for c in codebook:
        d = row[0] / c
        if np.allclose(np.min(np.abs(row[:, None] / d - codebook[None, :]), axis=1), 0, atol=1e-3):
            return True
    return False


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_turbo_keeps_block_norm_with_centroids(study, bits):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((8, 128)).astype(np.float32) * 3.0
    y = study.quant_turbo(x, bits)
    xb, yb = x.reshape(-1, 64), y.reshape(-1, 64)
    np.testing.assert_allclose(np.linalg.norm(yb, axis=1), np.linalg.norm(xb, axis=1), rtol=2e-3)
    assert all(_is_scaled_codebook(row, study.KVALUES[bits]) for row in yb)


def test_turbo_error_falls_with_bits(study):
    x = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    errors = [float(np.mean((study.quant_turbo(x, bits) - x) ** 2)) for bits in (2, 3, 4)]
    assert errors[0] > errors[1] > errors[2] > 0
