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


def _queries_keys_scale(seed, pos_step, d=64, n=40):
    """random q, k [n, 1, d], positions 0, pos_step, ... and a random per-pair scale [d/2]"""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, 1, d)).astype(np.float32)
    k = rng.standard_normal((n, 1, d)).astype(np.float32)
    return q, k, np.arange(n) * pos_step, rng.uniform(0.2, 5.0, d // 2).astype(np.float32)


def test_pair_scale_commutes_with_rope(study):
    q, k, pos, s_half = _queries_keys_scale(0, 37)
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


def test_norm_rope_pairs_are_adjacent(study):
    """llama arch (ggml NORM RoPE) rotates channels (2i, 2i+1): a scale shared by those pairs is exact, a scale
    shared by the NEOX pairs (i, i + d/2) is not."""
    q, k, pos, s_half = _queries_keys_scale(2, 29)
    n = len(pos)

    def logits(sq, sk):
        return np.einsum("td,ud->tu", study.rope(q * sq, pos, 1e5, "norm")[:, 0],
                         study.rope(k / sk, pos, 1e5, "norm")[:, 0])

    ref = logits(1.0, 1.0)
    s_norm = study.pair_full(s_half, "norm")
    np.testing.assert_array_equal(s_norm[0::2], s_norm[1::2])
    np.testing.assert_allclose(logits(s_norm, s_norm), ref, rtol=1e-4, atol=1e-3)
    s_neox = study.pair_full(s_half, "neox")
    assert np.abs(logits(s_neox, s_neox) - ref).max() > 1e-1

    # NORM RoPE keeps the norm of every adjacent pair and is the identity at position 0
    r = study.rope(k, pos, 1e5, "norm")
    np.testing.assert_allclose(r[:, 0, 0::2] ** 2 + r[:, 0, 1::2] ** 2, k[:, 0, 0::2] ** 2 + k[:, 0, 1::2] ** 2,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(study.rope(k, np.zeros(n), 1e5, "norm"), k)


def test_smooth_scale_norm_pairs(study):
    rng = np.random.default_rng(3)
    d, n = 64, 512
    k_rms = rng.uniform(0.1, 10.0, d // 2)
    q_rms = rng.uniform(0.1, 10.0, d // 2)
    k = rng.standard_normal((n, d)) * np.repeat(k_rms, 2)
    q = rng.standard_normal((n, 1, d)) * np.repeat(q_rms, 2)
    s = study.key_scale(study.parse_config("turbo3:scale=smooth,calib=0"), k.astype(np.float32),
                        q.astype(np.float32), "norm")
    ratio = s / np.sqrt(k_rms / q_rms)
    assert np.std(ratio) / np.mean(ratio) < 0.1


@pytest.mark.parametrize("pairing", ["neox", "norm"])
@pytest.mark.parametrize("opts", ["pmean", "mean", "whiten,calib=0", "whiten,pmean,calib=16", "scale=smooth,pmean"])
def test_key_transforms_are_exact(study, pairing, opts):
    """with exact (f32) key storage every transform leaves attention unchanged"""
    rng = np.random.default_rng(4)
    T, H, Hkv, d = 48, 4, 2, 64
    kpre = (rng.standard_normal((T, Hkv, d)) + 3 * rng.standard_normal(d)).astype(np.float32)
    pos = np.arange(T)
    k = study.rope(kpre, pos, 1e4, pairing)
    q = study.rope(rng.standard_normal((T, H, d)).astype(np.float32) * 2, pos, 1e4, pairing)
    v = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    att = study.Attn(q, k, v, kpre, 0, 1 / 8, 1e4, pairing)
    r = att.evaluate(study.parse_config("f32:" + opts), None)
    assert r["kl"] / r["n_q"] < 1e-6
    assert r["logit_se"] / r["logit_n"] < 1e-6


def test_whiten_gain_matches_pair_gain_for_diagonal_moments(study):
    """for pair-diagonal second moments the best full matrix is the per-pair scale"""
    rng = np.random.default_rng(5)
    a = rng.uniform(0.1, 5, 32)
    b = rng.uniform(0.1, 5, 32)
    g_pair = np.sqrt(a * b).sum() ** 2 / (a.sum() * b.sum())
    g_mat = study.matrix_gain(np.diag(np.repeat(b, 2)), np.diag(np.repeat(a, 2)))
    assert abs(g_mat - g_pair) < 1e-9


def _attn_with_values(study, seed, v_mean=4.0):
    rng = np.random.default_rng(seed)
    T, H, Hkv, d = 48, 4, 2, 64
    kpre = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    pos = np.arange(T)
    k = study.rope(kpre, pos, 1e4, "norm")
    q = study.rope(rng.standard_normal((T, H, d)).astype(np.float32), pos, 1e4, "norm")
    v = (rng.standard_normal((T, Hkv, d)) + v_mean * rng.standard_normal(d)).astype(np.float32)
    return study.Attn(q, k, v, kpre, 0, 1 / 8, 1e4, "norm")


@pytest.mark.parametrize("voff", ["none", "mean", "grid0", "exact0"])
def test_value_offsets_are_exact(study, voff):
    """with lossless value storage an offset left out of the values and added to the output changes nothing"""
    att = _attn_with_values(study, 6)
    r = att.evaluate(study.parse_config(f"f32:vq=f32,voff={voff},calib=0"), None)
    assert r["out_num"] / r["out_den"] < 1e-10
    r = att.evaluate(study.parse_config(f"f32:vq=f16,voff={voff},calib=0"), None)
    assert 0 < r["out_num"] / r["out_den"] < 1e-6


@pytest.mark.parametrize("qtype", ["turbo3", "turbo4"])
def test_value_grid0_stores_the_first_value_exactly(study, qtype):
    """grid0 moves the offset so that the first value is a fixed point of the V type"""
    att = _attn_with_values(study, 7)
    cfg = study.parse_config(f"f32:vq={qtype},voff=grid0,calib=0")
    v = att.v[:, 0, :]
    stored = att.stored_v(v, cfg)
    np.testing.assert_allclose(stored[0], v[0], rtol=0, atol=1e-5 * np.abs(v[0]).max())
    plain = att.stored_v(v, study.parse_config(f"f32:vq={qtype},calib=0"))
    assert np.abs(plain[0] - v[0]).max() > 1e-3 * np.abs(v[0]).max()


def test_value_mean_lowers_the_error_of_values_with_a_large_mean(study):
    """the offset helps where the values share a large mean and no value dominates"""
    att = _attn_with_values(study, 8, v_mean=6.0)
    plain = att.evaluate(study.parse_config("f32:vq=turbo3,calib=0"), None)
    mean = att.evaluate(study.parse_config("f32:vq=turbo3,voff=mean,calib=0"), None)
    assert mean["out_num"] < 0.5 * plain["out_num"]
