#!/usr/bin/env python3
"""Key-cache quantization study for TurboQuant keys, from real activations.

Reads the per-layer post-RoPE Q/K, pre-RoPE K and V dumped by scripts/kv_dump.cpp (raw f32, see the
comment at the top of that file), re-implements in numpy the K-cache path of the patched llama.cpp
(Walsh-Hadamard rotation of K and Q, then turbo2/3/4 / q4_0 / q8_0 / f16 storage of K) and measures, for
causal (sliding-window where the model uses it) attention with the real queries and the model's scaling
(Gemma 3: Q * 1/sqrt(head_dim), kq_scale 1; llama: kq_scale 1/sqrt(head_dim), GQA groups of n_head/n_head_kv
query heads), how much each key configuration disturbs attention. The RoPE pairing (NORM: channels (2i, 2i+1),
llama arch; NEOX: (i, i + d/2), Gemma), the RoPE base and the sliding window come from the dump's meta.txt
(older dumps without them: Gemma 3 270M's values); the command line overrides them.

  kl      mean KL(p_ref || p_quant) of the attention distribution, nats, averaged over heads and queries
  out     relative error of the attention output sum_j p_ij v_j (V kept exact): sqrt(sum|do|^2 / sum|o|^2)
  logit   RMS error of the attention logits over the allowed (query, key) pairs

Unless a value option says otherwise, only K (and the matching Q transform) changes and V stays exact. The
reference is f32 attention.

Key transforms (all exact in exact arithmetic, q.k = (q*s).(k/s)):
  scale=<kind>  per-RoPE-pair channel scale s (both channels of a RoPE pair share s),
                calibrated per layer and KV head on the first N tokens of each context (chunk):
                  max     s = max_t |k_pair|                 (pair norm, RoPE invariant)
                  rms     s = rms_t |k_pair| / sqrt(2)
                  sqrtrms s = sqrt(rms_k)
                  smooth  s = rms_k^a / rms_q^(1-a)          (SmoothQuant, alpha=a, default 0.5: the
                                                               minimizer of E|(q*s).e|^2 for noise e
                                                               ~ |k/s| isotropic after the rotation;
                                                               rms_q over the query heads of the group)
                  head    one scalar per KV head (rms)       (a no-op for turbo: block norm is stored)
  calib=N       number of calibration tokens (N = 0: all tokens of the chunk, an oracle)
  nobos         calibrate without the BOS token (position 0)
  mean          remove the per-channel mean mu of the pre-RoPE key (calibrated like the scale), store
                rope(k - mu) and add q . rope(mu, pos) exactly (it is a deterministic function of pos)
  pmean         remove the per-channel mean mu of the post-RoPE key (calibrated like the scale): store k - mu;
                q . mu is the same for all keys of a query, so softmax ignores it (added back only for the
                logit-error metric)
  whiten        full-matrix key transform A after RoPE (k -> A k, q -> A^-T q, exact), A = P^1/2 with
                P = Sk^-1 # Sq (matrix geometric mean of the calibration second moments; after mean/pmean):
                the best linear transform for an isotropic quantizer. wreg=r: ridge (default 1e-3)
  sink=n        keep the keys of the first n positions exact (f16) instead of quantized
  rot=n         Hadamard block size (llama.cpp uses n_rot_k = 256 for head_dim 256); 0 = none
  signs         random +-1 signs before the Hadamard rotation (a randomized Hadamard transform)
  ls            turbo scale d = <x,c>/|c|^2 (least squares) instead of the norm-keeping |x|/|c|

Value options (the metric is then `out`; with key type f32 the keys are exact and only V changes):
  vq=<type>     store V as the cache does with a quantized V type: Hadamard-rotated rows of <type>
  voff=<kind>   a value offset mu left out of every stored value and added to the output (exact: a query's
                probabilities sum to 1): mean (of the values after the first, calibration slice), grid0 (that
                mean moved by the first value's coding error, so that the first value is on the grid), exact0
                (no offset, the first value kept exact: a side copy)

Usage examples:
  python scripts/key_quant_study.py --dump /tmp/keystudy/dump --validate-c build/cpu-0bf587e88990/bin/libggml-base.so
  python scripts/key_quant_study.py --dump /tmp/keystudy/dump --check-rope
  python scripts/key_quant_study.py --dump /tmp/keystudy/dump --suite main --json /tmp/keystudy/main.json
  python scripts/key_quant_study.py --dump /tmp/keystudy/dump --config turbo3:scale=smooth,calib=64 --config q4_0
  python scripts/key_quant_study.py --dump /tmp/smolstudy/dump --config turbo3:whiten,calib=512,pmean,nobos,sink=1
  python scripts/key_quant_study.py --dump /tmp/smolstudy/dump --stats     # rate-distortion statistics per layer
  python scripts/key_quant_study.py --dump /tmp/smolstudy/dump --config f32:vq=turbo4,voff=grid0,calib=512 \
      --config f32:vq=q4_0,calib=512 --ref f32:vq=q4_0,calib=512     # values only
  python scripts/key_quant_study.py --from-json /tmp/keystudy/main.json --per-layer "q4_0;turbo3"
  # end-to-end check of a static scale (Gemma: folded into q_norm/k_norm), then llama-perplexity on OUT:
  python scripts/key_quant_study.py --scaled-gguf ~/.cache/polyforge/models/gemma-3-270m-q4_k_m.gguf OUT.gguf

Everything is deterministic (the only random numbers, for option signs, come from --seed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from polyforge.models.gguf import read_tensors

F32 = np.float32

# ---------------------------------------------------------------------------------------------------
# codebooks, copied as numbers from vendor/llama.cpp/ggml/src/ggml-common.h (kvalues_turbo2/3/4)
KVALUES = {
    2: np.array([-1.4999716, -0.4521173, +0.4521173, +1.4999716], dtype=F32),
    3: np.array([-2.1112794, -1.3293060, -0.7506256, -0.2437397,
                 +0.2437397, +0.7506256, +1.3293060, +2.1112794], dtype=F32),
    4: np.array([-2.6462320, -2.0231410, -1.5906708, -1.2392310, -0.9317366, -0.6503614, -0.3846249, -0.1273181,
                 +0.1273181, +0.3846249, +0.6503614, +0.9317366, +1.2392310, +1.5906708, +2.0231410, +2.6462320],
                dtype=F32),
}
QK_TURBO = 64
BITS_PER_VALUE = {"f32": 32.0, "f16": 16.0, "q8_0": 8.5, "q4_0": 4.5,
                  "turbo2": 2.25, "turbo3": 3.25, "turbo4": 4.25}


def _fp16(x):
    return np.asarray(x, dtype=F32).astype(np.float16).astype(F32)


def quant_turbo(x, bits, ls=False):
    """ggml-quants.c quantize_row_turbo_impl + dequantize_row_turbo_impl on the last axis (multiple of 64)."""
    kv = KVALUES[bits]
    shape = x.shape
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, QK_TURBO)
    mid = (F32(0.5) * (kv[:-1] + kv[1:])).astype(F32)
    sumx2 = np.cumsum(xb * xb, axis=1, dtype=F32)[:, -1]        # sequential f32 sum as in C
    norm = np.sqrt(sumx2).astype(F32)
    with np.errstate(divide="ignore"):
        idn = np.where(norm > 0, F32(math.sqrt(QK_TURBO)) / norm, F32(0)).astype(F32)
    u = xb * idn[:, None]
    q = np.zeros(xb.shape, dtype=np.int32)
    for m in range(len(mid)):
        q += (u > mid[m])
    c = kv[q]
    if ls:
        num = np.sum(xb.astype(np.float64) * c, axis=1)
        den = np.sum(c.astype(np.float64) * c, axis=1)
        d = np.where(den > 0, num / np.where(den > 0, den, 1), 0).astype(F32)
    else:
        sumc2 = np.cumsum(c * c, axis=1, dtype=F32)[:, -1]
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(sumc2 > 0, norm / np.sqrt(sumc2), F32(0)).astype(F32)
    d = _fp16(d)
    return (d[:, None] * c).reshape(shape)


def quant_q4_0(x):
    """quantize_row_q4_0_ref + dequantize_row_q4_0 on the last axis (blocks of 32)."""
    shape = x.shape
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, 32)
    ia = np.argmax(np.abs(xb), axis=1)                           # first index of the max |x| (strict <)
    mx = xb[np.arange(xb.shape[0]), ia]
    d = (mx / F32(-8)).astype(F32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    v = (xb * idd[:, None] + F32(8.5)).astype(F32)
    qi = np.minimum(15, np.trunc(v).astype(np.int32))
    return ((qi - 8).astype(F32) * _fp16(d)[:, None]).reshape(shape)


def quant_q8_0(x):
    """quantize_row_q8_0_ref + dequantize_row_q8_0 on the last axis (blocks of 32)."""
    shape = x.shape
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, 32)
    amax = np.max(np.abs(xb), axis=1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    v = xb * idd[:, None]
    qi = np.sign(v) * np.floor(np.abs(v) + F32(0.5))            # roundf: half away from zero
    return (qi.astype(F32) * _fp16(d)[:, None]).reshape(shape)


def quantize(x, qtype, ls=False):
    if qtype == "f32":
        return np.asarray(x, dtype=F32)
    if qtype == "f16":
        return _fp16(x)
    if qtype == "q8_0":
        return quant_q8_0(x)
    if qtype == "q4_0":
        return quant_q4_0(x)
    if qtype.startswith("turbo"):
        return quant_turbo(x, int(qtype[5:]), ls=ls)
    raise ValueError(qtype)


def hadamard(n):
    """Orthonormal Sylvester Walsh-Hadamard matrix as ggml_gen_hadamard (llama-kv-cache.cpp) builds it."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / math.sqrt(n)).astype(F32)


def rotate(x, n, signs=None):
    """llama_mul_mat_hadamard: rows of n contiguous values times H_n (H symmetric)."""
    if n == 0:
        return x
    shape = x.shape
    y = x.reshape(-1, n)
    if signs is not None:
        y = y * signs[None, :]
    return (y @ hadamard(n)).reshape(shape)


# ---------------------------------------------------------------------------------------------------
# model specifics. From the dump's meta.txt where kv_dump wrote them (arch, rope_type, rope_freq_base,
# n_swa); older dumps (Gemma 3 270M) lack them, so the defaults are Gemma 3 270M's, read from the llama.cpp
# log: NEOX RoPE, n_swa 512, pattern 6, rope bases 1e4 (SWA) / 1e6. Command-line values override both.

GEMMA3 = {"swa_pattern": 6, "n_swa": 512, "rope_base": 1e6, "rope_base_swa": 1e4, "rope_type": "neox"}
ROPE_TYPES = {0: "norm", 2: "neox"}


class Model:
    def __init__(self, meta, args):
        self.n_layer = int(meta["n_layer"])
        self.n_head = int(meta["n_head"])
        self.n_head_kv = int(meta["n_head_kv"])
        self.n_ctx = int(meta["n_ctx"])
        self.n_chunks = int(meta["n_chunks"])
        self.arch = meta.get("arch", "gemma3")
        gemma = self.arch.startswith("gemma")

        def pick(name, from_meta):
            v = getattr(args, name, None)
            if v is not None:
                return v
            if from_meta is not None:
                return from_meta
            return GEMMA3[name]

        n_swa_meta = int(meta["n_swa"]) if "n_swa" in meta else None
        self.n_swa = pick("n_swa", n_swa_meta)
        # the SWA layer pattern is not in the public API: Gemma 3's where the model has a window, else none
        self.swa_pattern = pick("swa_pattern", None if (gemma or n_swa_meta is None) else 0)
        if not self.n_swa:
            self.swa_pattern = 0
        self.base_full = pick("rope_base", float(meta["rope_freq_base"]) if "rope_freq_base" in meta else None)
        base_swa_meta = float(meta["rope_freq_base_swa"]) if float(meta.get("rope_freq_base_swa", 0)) > 0 else None
        if base_swa_meta is None and "rope_freq_base" in meta and not gemma:
            base_swa_meta = self.base_full
        self.base_swa = pick("rope_base_swa", base_swa_meta)
        rt = ROPE_TYPES.get(int(meta["rope_type"])) if "rope_type" in meta else None
        if "rope_type" in meta and rt is None:
            raise SystemExit(f"rope_type {meta['rope_type']} of the dump is neither NORM (0) nor NEOX (2)")
        self.pairing = pick("rope_type", rt)
        self.freq_scale = float(meta.get("rope_freq_scale", 1.0))
        self.full_window = args.full_window

    def is_swa(self, il):
        return self.swa_pattern > 0 and il % self.swa_pattern < self.swa_pattern - 1

    def window(self, il):
        return 0 if (self.full_window or not self.is_swa(il)) else self.n_swa

    def rope_base(self, il):
        return self.base_swa if self.is_swa(il) else self.base_full


def rope_pairs(x, pos, base, pairing):
    """llama.cpp RoPE on the last axis, theta_i = pos * base^(-2i/d), rotating channel pairs (i, i + d/2)
    (NEOX, rope type 2, Gemma) or (2i, 2i + 1) (NORM, rope type 0, llama arch)."""
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    shp = (len(pos),) + (1,) * (x.ndim - 2) + (half,)
    c = np.cos(ang).astype(F32).reshape(shp)
    s = np.sin(ang).astype(F32).reshape(shp)
    x0, x1 = pair_split(x, pairing)
    r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
    if pairing == "norm":
        out = np.empty(np.broadcast_shapes(x.shape), dtype=F32)
        out[..., 0::2], out[..., 1::2] = r0, r1
        return out
    return np.concatenate([r0, r1], axis=-1).astype(F32)


def rope_neox(x, pos, base):
    return rope_pairs(x, pos, base, "neox")


def rope_norm(x, pos, base):
    return rope_pairs(x, pos, base, "norm")


def rope(x, pos, base, pairing="neox", freq_scale=1.0):
    """RoPE of the model's type; freq_scale multiplies the positions (linear scaling, 1 = none)."""
    p = pos * freq_scale if freq_scale != 1.0 else pos
    return rope_norm(x, p, base) if pairing == "norm" else rope_neox(x, p, base)


def pair_split(x, pairing="neox"):
    """the two channels of every RoPE pair: ([..., d/2], [..., d/2])"""
    if pairing == "norm":
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def pair_full(s, pairing="neox"):
    """a per-pair vector [d/2] spread to the d channels (both channels of a pair get the value)"""
    return np.repeat(s, 2) if pairing == "norm" else np.concatenate([s, s])


def read_meta(dump):
    meta = {}
    with open(os.path.join(dump, "meta.txt")) as f:
        for line in f:
            k, _, v = line.strip().partition(" ")
            meta[k] = v
    return meta


def load(dump, name, il, c, shape):
    a = np.fromfile(os.path.join(dump, f"{name}_{il}_c{c}.f32"), dtype=F32)
    return a.reshape(shape)


# ---------------------------------------------------------------------------------------------------
# configurations

def parse_config(text):
    """'turbo3:scale=smooth,calib=64,mean,sink=1' -> dict"""
    qtype, _, opts = text.partition(":")
    cfg = {"name": text, "qtype": qtype, "scale": "none", "calib": 64, "nobos": False, "mean": False,
           "sink": 0, "rot": None, "signs": False, "ls": False, "qquant": None, "alpha": 0.5,
           "pmean": False, "whiten": False, "wreg": 1e-3, "vq": "f32", "voff": "none"}
    if qtype not in BITS_PER_VALUE:
        raise SystemExit(f"unknown key type {qtype!r} in {text!r}")
    for o in filter(None, opts.split(",")):
        k, eq, v = o.partition("=")
        if k == "scale":
            cfg["scale"] = v
        elif k == "calib":
            cfg["calib"] = int(v)
        elif k == "sink":
            cfg["sink"] = int(v)
        elif k == "rot":
            cfg["rot"] = int(v)
        elif k in ("nobos", "mean", "signs", "ls", "pmean", "whiten"):
            cfg[k] = True
        elif k == "alpha":
            cfg["alpha"] = float(v)
        elif k == "wreg":
            cfg["wreg"] = float(v)
        elif k == "qquant":
            cfg["qquant"] = v
        elif k == "vq":
            if v not in BITS_PER_VALUE:
                raise SystemExit(f"unknown value type {v!r} in {text!r}")
            cfg["vq"] = v
        elif k == "voff":
            cfg["voff"] = v
        else:
            raise SystemExit(f"unknown option {o!r} in {text!r}")
    if cfg["scale"] not in ("none", "max", "rms", "sqrtrms", "smooth", "head"):
        raise SystemExit(f"unknown scale {cfg['scale']!r}")
    if cfg["voff"] not in ("none", "mean", "grid0", "exact0"):
        raise SystemExit(f"unknown value offset {cfg['voff']!r}")
    if cfg["mean"] and cfg["pmean"]:
        raise SystemExit(f"mean and pmean exclude each other in {text!r}")
    if cfg["whiten"] and cfg["scale"] != "none":
        raise SystemExit(f"whiten replaces the pair scale in {text!r}")
    return cfg


def _sqrtm_psd(m):
    w, u = np.linalg.eigh((m + m.T) / 2)
    return (u * np.sqrt(np.maximum(w, 0))) @ u.T


def whiten_matrix(k_c, q_c, reg=1e-3):
    """the full-matrix key transform A (k -> A k, q -> A^-T q, applied after RoPE, so exact) that minimizes
    tr(A^-T Sq A^-1) * tr(A Sk A^T), i.e. the q-weighted error of a quantizer whose error is isotropic and
    proportional to |A k|^2 (turbo after the Hadamard rotation). Sk, Sq: second moments of the calibration
    keys [n, d] and queries [m, d]. A = P^1/2 with P = Sk^-1 # Sq (matrix geometric mean); the per-pair
    smooth scale is this with P restricted to diagonal pairs. reg: ridge, relative to the mean eigenvalue."""
    d = k_c.shape[-1]
    sk = k_c.T.astype(np.float64) @ k_c.astype(np.float64) / len(k_c)
    sq = q_c.T.astype(np.float64) @ q_c.astype(np.float64) / len(q_c)
    sk += reg * np.trace(sk) / d * np.eye(d)
    sq += reg * np.trace(sq) / d * np.eye(d)
    r = _sqrtm_psd(sk)
    ri = np.linalg.inv(r)
    p = ri @ _sqrtm_psd(r @ sq @ r) @ ri
    a = _sqrtm_psd(p)
    a /= np.sqrt(np.trace(a @ a.T) / d)
    return a.astype(F32), np.linalg.inv(a).astype(F32)


def matrix_gain(sk, sq):
    """(tr sqrt(Sk^1/2 Sq Sk^1/2))^2 / (tr Sk tr Sq): the factor by which the best full-matrix transform
    lowers the q-weighted error of an isotropic quantizer (1 = no gain). Its per-pair analogue is
    (sum_p sqrt(a_p b_p))^2 / (sum a sum b) with the pair energies a (queries) and b (keys)."""
    r = _sqrtm_psd(sk)
    w = np.linalg.eigvalsh(r @ sq @ r)
    return float(np.sqrt(np.maximum(w, 0)).sum() ** 2 / (np.trace(sk) * np.trace(sq)))


SUITES = {
    "base": ["f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2"],
    "main": [
        "f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2",
        # (a) per-RoPE-pair scales, 4 formulas x N = 16/64/256 (+ oracle N = all)
        *[f"turbo3:scale={s},calib={n}" for s in ("max", "rms", "sqrtrms", "smooth") for n in (16, 64, 256)],
        "turbo3:scale=smooth,calib=0", "turbo3:scale=rms,calib=0",
        *[f"turbo4:scale={s},calib={n}" for s in ("rms", "smooth") for n in (16, 64, 256)],
        "turbo4:scale=max,calib=64", "turbo4:scale=sqrtrms,calib=64",
        "turbo2:scale=smooth,calib=64",
        # BOS left out of the calibration
        "turbo3:scale=smooth,calib=16,nobos", "turbo3:scale=smooth,calib=64,nobos",
        "turbo3:scale=rms,calib=64,nobos",
        # (b) + pre-RoPE mean removal
        "turbo3:mean,calib=64", "turbo3:scale=smooth,calib=64,mean", "turbo3:scale=rms,calib=64,mean",
        "turbo4:scale=smooth,calib=64,mean",
        "turbo3:scale=smooth,calib=16,mean", "turbo3:scale=smooth,calib=256,mean", "turbo3:scale=smooth,calib=0,mean",
        "turbo3:scale=smooth,calib=64,mean,nobos", "turbo3:scale=smooth,calib=64,mean,sink=1",
        "turbo4:scale=smooth,calib=16,mean", "turbo2:scale=smooth,calib=64,mean",
        # (c) other cheap things
        "turbo3:scale=head,calib=64", "turbo3:sink=1", "turbo3:scale=smooth,calib=64,sink=1",
        "turbo4:sink=1", "turbo4:scale=smooth,calib=64,sink=1",
        "turbo3:rot=64", "turbo3:signs", "turbo3:ls", "turbo3:rot=0", "q4_0:rot=0",
        "q4_0:scale=smooth,calib=64",
    ],
}


# ---------------------------------------------------------------------------------------------------

def pair_energy(x, pairing="neox"):
    """mean over tokens (and heads) of the squared norm of each RoPE pair: [half]"""
    half = x.shape[-1] // 2
    x0, x1 = pair_split(x, pairing)
    e = x0.astype(np.float64) ** 2 + x1.astype(np.float64) ** 2
    return e.reshape(-1, half).mean(axis=0)


def calib_slice(cfg, n_tok):
    start = 1 if cfg["nobos"] else 0
    n = cfg["calib"]
    end = n_tok if n == 0 else min(n_tok, start + n)
    return slice(start, end)


def key_scale(cfg, k_post, q_post, pairing="neox"):
    """per-pair scale s [half] for one KV head, or None. k_post [T, d], q_post [T, g, d] (the group)."""
    kind = cfg["scale"]
    if kind == "none":
        return None
    sl = calib_slice(cfg, k_post.shape[0])
    kc = k_post[sl]
    half = k_post.shape[-1] // 2
    k0, k1 = pair_split(kc, pairing)
    mag = np.sqrt(k0.astype(np.float64) ** 2 + k1.astype(np.float64) ** 2)
    rms_k = np.sqrt((mag ** 2).mean(axis=0) / 2.0)
    if kind == "max":
        s = mag.max(axis=0)
    elif kind == "rms":
        s = rms_k
    elif kind == "sqrtrms":
        s = np.sqrt(rms_k)
    elif kind == "smooth":
        rms_q = np.sqrt(pair_energy(q_post[sl], pairing) / 2.0)
        a = cfg["alpha"]
        s = rms_k ** a / np.maximum(rms_q, 1e-30) ** (1.0 - a)
    elif kind == "head":
        s = np.full(half, np.sqrt((rms_k ** 2).mean()))
    s = np.maximum(s, 1e-3 * s.max())          # no channel blows up if it was ~0 in the calibration window
    s = s / np.sqrt((s ** 2).mean())           # overall level does not matter; keep values O(1)
    return s.astype(F32)


class Attn:
    """Reference attention for one layer/chunk; evaluates key configurations against it."""

    def __init__(self, q, k, v, kpre, window, scale, base, pairing="neox", freq_scale=1.0):
        # q [T, H, d] (post-RoPE, unscaled), k/kpre/v [T, Hkv, d]
        self.T, self.H, self.d = q.shape
        self.Hkv = k.shape[1]
        self.g = self.H // self.Hkv
        self.q = q
        self.k = k
        self.v = v
        self.kpre = kpre
        self.scale = F32(scale)
        self.base = base
        self.pairing = pairing
        self.freq_scale = freq_scale
        self.pos = np.arange(self.T)
        i = self.pos[:, None]
        j = self.pos[None, :]
        allowed = j <= i
        if window:
            allowed &= (i - j) < window
        self.allowed = allowed
        self.neg = np.where(allowed, F32(0), F32(-np.inf)).astype(F32)
        self.ref = [self._probs(self._logits_exact(h)) for h in range(self.Hkv)]
        self.o_ref = [np.matmul(self.ref[h][1], v[:, h, :]) for h in range(self.Hkv)]

    def _logits_exact(self, hk):
        qg = self.q[:, hk * self.g:(hk + 1) * self.g, :].astype(np.float64)      # [T, g, d]
        kk = self.k[:, hk, :].astype(np.float64)                                 # [T, d]
        lg = np.einsum("tgd,sd->gts", qg, kk) * float(self.scale)
        return lg.astype(F32)

    def _probs(self, lg):
        lg = lg + self.neg[None]
        m = lg.max(axis=-1, keepdims=True)
        z = lg - m
        p = np.exp(z)
        ssum = p.sum(axis=-1, keepdims=True)
        logp = z - np.log(ssum)
        p = p / ssum
        return lg, p, logp

    def stored_v(self, v, cfg):
        """V as attention reads it: rot(v - mu) quantized, un-rotated, mu added back (exact: the
        probabilities of a query sum to 1). voff: mean = mu the mean of the values after the first
        (calibration slice); grid0 = that mu moved by the first value's coding error, so that the
        first value is stored on the V type's grid; exact0 = the first value kept exact (a side copy)."""
        n = default_rot(self.d)
        mu = np.zeros(self.d, dtype=F32)
        if cfg["voff"] in ("mean", "grid0"):
            sl = calib_slice(cfg, self.T)
            sl = slice(max(sl.start, 1), sl.stop)
            mu = v[sl].astype(np.float64).mean(axis=0).astype(F32)
        if cfg["voff"] == "grid0":
            # offset as stored: rot(mu') = rot(v0) - x0', x0' the first value's round trip through the V type
            x0q = quantize(rotate(v[:1] - mu[None, :], n), cfg["vq"])
            bias = rotate(v[:1], n) - x0q
            x = rotate(v, n) - bias      # as the cache would store it: the first row is x0' exactly
            mu = rotate(bias, n)[0]
        else:
            x = rotate(v - mu[None, :], n)
        xq = quantize(x, cfg["vq"])
        if cfg["voff"] == "exact0":
            xq = xq.copy()
            xq[:1] = x[:1]
        return rotate(xq, n) + mu[None, :]

    def evaluate(self, cfg, rng_signs):
        out = {"kl": 0.0, "out_num": 0.0, "out_den": 0.0, "logit_se": 0.0, "logit_n": 0}
        rot = cfg["rot"] if cfg["rot"] is not None else default_rot(self.d)
        qtype = cfg["qtype"]
        if qtype in ("f32",):
            rot = 0
        for hk in range(self.Hkv):
            qg = self.q[:, hk * self.g:(hk + 1) * self.g, :]                       # [T, g, d]
            k = self.k[:, hk, :]
            extra = None
            sl = calib_slice(cfg, self.T)
            if cfg["mean"]:
                kp = self.kpre[:, hk, :]
                mu = kp[sl].astype(np.float64).mean(axis=0).astype(F32)
                k = rope(kp - mu[None, :], self.pos, self.base, self.pairing, self.freq_scale)
                kmu = rope(np.broadcast_to(mu, kp.shape).copy(), self.pos, self.base, self.pairing, self.freq_scale)
                extra = np.matmul(np.ascontiguousarray(qg.transpose(1, 0, 2)), kmu.T) * self.scale  # exact
            if cfg["pmean"]:
                # post-RoPE mean: q . mu is the same for every key of a query, so softmax ignores it; it is
                # added back here only so that the logit error stays comparable
                mu = k[sl].astype(np.float64).mean(axis=0).astype(F32)
                k = k - mu[None, :]
                extra = np.broadcast_to((np.einsum("tgd,d->gt", qg, mu) * self.scale)[:, :, None],
                                        (self.g, self.T, self.T))
            if cfg["whiten"]:
                a, ainv = whiten_matrix(k[sl], qg[sl].reshape(-1, self.d), cfg["wreg"])
                k = k @ a.T
                qg = qg @ ainv
            s = key_scale(cfg, k, qg, self.pairing)
            if s is not None:
                sf = pair_full(s, self.pairing)
                k = k / sf[None, :]
                qg = qg * sf[None, None, :]
            signs = rng_signs if cfg["signs"] else None
            kr = rotate(k, rot, signs)
            qr = rotate(qg, rot, signs) * self.scale
            kq = quantize(kr, qtype, ls=cfg["ls"])
            if cfg["sink"] > 0:
                kq = kq.copy()
                kq[:cfg["sink"]] = _fp16(kr[:cfg["sink"]])
            qq = cfg["qquant"] or default_qquant(qtype)
            if qq != "f32":
                qr = quantize(qr, qq)
            lg = np.matmul(np.ascontiguousarray(qr.transpose(1, 0, 2)), kq.T.astype(F32))
            if extra is not None:
                lg = lg + extra
            lg_ref, p_ref, logp_ref = self.ref[hk]
            _, p, logp = self._probs(lg)
            lp_ref0 = np.where(self.allowed[None], logp_ref, F32(0))
            lp0 = np.where(self.allowed[None], logp, F32(0))
            out["kl"] += float((p_ref * (lp_ref0 - lp0)).sum(dtype=np.float64))
            diff = np.where(self.allowed[None], lg - np.where(self.allowed[None], lg_ref, F32(0)), F32(0))
            out["logit_se"] += float(np.square(diff).sum(dtype=np.float64))
            out["logit_n"] += int(self.allowed.sum()) * self.g
            vv = self.v[:, hk, :]
            if cfg["vq"] != "f32" or cfg["voff"] != "none":
                vv = self.stored_v(vv, cfg)
            o_ref = self.o_ref[hk]
            o = np.matmul(p, vv)
            out["out_num"] += float(((o - o_ref).astype(np.float64) ** 2).sum())
            out["out_den"] += float((o_ref.astype(np.float64) ** 2).sum())
        out["n_q"] = self.T * self.H
        return out


def default_rot(d):
    """n_rot_k as llama-kv-cache.cpp picks it: 64 doubled while head_dim % (2*n) == 0."""
    n = 64
    while d % (2 * n) == 0:
        n *= 2
    return n


def default_qquant(qtype):
    """what the CPU flash-attention kernel does to Q: converts it to the vec_dot_type of the K type"""
    return {"q8_0": "q8_0", "q4_0": "q8_0", "f16": "f16"}.get(qtype, "f32")


# ---------------------------------------------------------------------------------------------------

def run_study(args, configs):
    meta = read_meta(args.dump)
    model = Model(meta, args)
    T = model.n_ctx
    H, Hkv = model.n_head, model.n_head_kv
    chunks = list(range(model.n_chunks)) if args.chunks is None else [int(c) for c in args.chunks.split(",")]
    layers = list(range(model.n_layer)) if args.layers is None else [int(x) for x in args.layers.split(",")]
    d = os.path.getsize(os.path.join(args.dump, f"k_0_c{chunks[0]}.f32")) // 4 // (T * Hkv)
    rng = np.random.default_rng(args.seed)
    signs = rng.choice(np.array([-1.0, 1.0], dtype=F32), size=default_rot(d))
    res = {c["name"]: {"per_layer": {}} for c in configs}
    t0 = time.time()
    for il in layers:
        acc = {c["name"]: {"kl": 0.0, "out_num": 0.0, "out_den": 0.0, "logit_se": 0.0, "logit_n": 0, "n_q": 0}
               for c in configs}
        for ch in chunks:
            q = load(args.dump, "q", il, ch, (T, H, d))
            k = load(args.dump, "k", il, ch, (T, Hkv, d))
            kpre = load(args.dump, "kpre", il, ch, (T, Hkv, d))
            v = load(args.dump, "v", il, ch, (T, Hkv, d))
            att = Attn(q, k, v, kpre, model.window(il), args.attn_scale or 1.0 / math.sqrt(d),
                       model.rope_base(il), model.pairing, model.freq_scale)
            for c in configs:
                r = att.evaluate(c, signs)
                for key in acc[c["name"]]:
                    acc[c["name"]][key] += r[key]
        for c in configs:
            a = acc[c["name"]]
            res[c["name"]]["per_layer"][il] = {
                "kl": a["kl"] / a["n_q"],
                "out": math.sqrt(a["out_num"] / a["out_den"]),
                "logit": math.sqrt(a["logit_se"] / a["logit_n"]),
            }
        print(f"# layer {il:2d} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    for c in configs:
        pl = res[c["name"]]["per_layer"]
        kls = np.array([pl[il]["kl"] for il in layers])
        outs = np.array([pl[il]["out"] for il in layers])
        lgs = np.array([pl[il]["logit"] for il in layers])
        res[c["name"]].update({
            "config": c, "bits": BITS_PER_VALUE[c["qtype"]],
            "kl_mean": float(kls.mean()), "kl_worst": float(kls.max()), "kl_worst_layer": int(layers[int(kls.argmax())]),
            "out_mean": float(outs.mean()), "out_worst": float(outs.max()), "logit_mean": float(lgs.mean()),
        })
    return res, {"layers": layers, "chunks": chunks, "n_ctx": T, "head_dim": d, "n_head": H, "n_head_kv": Hkv,
                 "arch": model.arch, "rope": model.pairing,
                 "windows": {il: model.window(il) for il in layers}, "rot_default": default_rot(d),
                 "seconds": time.time() - t0}


def print_table(res, info, ref="q4_0", file=sys.stdout):
    refkl = res[ref]["kl_mean"] if ref in res else None
    refout = res[ref]["out_mean"] if ref in res else None
    print("| config | bits/key value | mean KL (nats) | worst layer KL (layer) | mean out rel err | "
          f"logit RMS err | KL / {ref} | out err / {ref} |", file=file)
    print("|---|---|---|---|---|---|---|---|", file=file)
    for name, r in res.items():
        rk = f"{r['kl_mean'] / refkl:.2f}" if refkl else "-"
        ro = f"{r['out_mean'] / refout:.2f}" if refout else "-"
        print(f"| {name} | {r['bits']:.2f} | {r['kl_mean']:.5f} | {r['kl_worst']:.5f} ({r['kl_worst_layer']}) | "
              f"{r['out_mean']:.4f} | {r['logit_mean']:.4f} | {rk} | {ro} |", file=file)


def print_per_layer(res, info, names, file=sys.stdout):
    print("| layer | window | " + " | ".join(names) + " |", file=file)
    print("|---|---|" + "---|" * len(names), file=file)
    for il in info["layers"]:
        w = info["windows"][il] or "full"
        print(f"| {il} | {w} | " + " | ".join(f"{res[n]['per_layer'][il]['kl']:.5f}" for n in names) + " |",
              file=file)


# ---------------------------------------------------------------------------------------------------

def validate_c(args):
    """compare the numpy quantizers with quantize_row_*_ref / dequantize_row_* of libggml-base.so"""
    import ctypes
    lib = ctypes.CDLL(args.validate_c)
    meta = read_meta(args.dump)
    T, Hkv = int(meta["n_ctx"]), int(meta["n_head_kv"])
    d = os.path.getsize(os.path.join(args.dump, "k_0_c0.f32")) // 4 // (T * Hkv)
    ok = True
    for il in (0, int(meta["n_layer"]) // 2, int(meta["n_layer"]) - 1):
        k = load(args.dump, "k", il, 0, (T * Hkv, d))
        x = np.ascontiguousarray(rotate(k, default_rot(d)), dtype=F32)
        x = np.concatenate([x, np.zeros((1, d), F32)])          # an all-zero row as an edge case
        n = x.size
        for name, blk, qk in (("turbo2_0", 18, 64), ("turbo3_0", 26, 64), ("turbo4_0", 34, 64),
                              ("q4_0", 18, 32), ("q8_0", 34, 32)):
            qf = getattr(lib, f"quantize_row_{name}_ref")
            df = getattr(lib, f"dequantize_row_{name}")
            qf.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            df.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            buf = np.zeros(n // qk * blk, dtype=np.uint8)
            out = np.zeros(n, dtype=F32)
            qf(x.ctypes.data, buf.ctypes.data, n)
            df(buf.ctypes.data, out.ctypes.data, n)
            mine = quantize(x, name.replace("_0", "") if name.startswith("turbo") else name).reshape(-1)
            diff = np.abs(mine - out)
            nbad = int((diff > 1e-6 * (1 + np.abs(out))).sum())
            relerr = float(np.linalg.norm(out - x.reshape(-1)) / np.linalg.norm(x))
            print(f"layer {il:2d} {name:9s}: {n} values, {nbad} differ from C (max |diff| {diff.max():.3g}), "
                  f"C quantization rel. error {relerr:.4f}")
            ok &= nbad == 0
    print("validation:", "OK, bit-exact" if ok else "MISMATCH")
    return 0 if ok else 1


def check_rope(args):
    meta = read_meta(args.dump)
    model = Model(meta, args)
    T, Hkv = model.n_ctx, model.n_head_kv
    d = os.path.getsize(os.path.join(args.dump, "k_0_c0.f32")) // 4 // (T * Hkv)
    worst = 0.0
    for il in range(model.n_layer):
        k = load(args.dump, "k", il, 0, (T, Hkv, d))
        kp = load(args.dump, "kpre", il, 0, (T, Hkv, d))
        kr = rope(kp, np.arange(T), model.rope_base(il), model.pairing, model.freq_scale)
        e = float(np.abs(kr - k).max() / np.abs(k).max())
        worst = max(worst, e)
        print(f"layer {il:2d} {model.pairing} base {model.rope_base(il):>9.0f}: max |rope(kpre) - k| / max|k| = {e:.2e}")
    print("rope check:", "OK" if worst < 1e-4 else "MISMATCH", f"(worst {worst:.2e})")
    return 0 if worst < 1e-4 else 1


def rel_mse(x, qtype):
    """sum |Q(x) - x|^2 / sum |x|^2 of a key quantizer on rows x (already rotated)"""
    x = np.asarray(x, dtype=F32)
    return float(np.sum((quantize(x, qtype).astype(np.float64) - x) ** 2) / np.sum(x.astype(np.float64) ** 2))


def block_kurtosis(x):
    """kurtosis of the values of 64-blocks normalized to unit RMS (what the turbo codebook sees; Gaussian: 3)"""
    xb = np.asarray(x, dtype=np.float64).reshape(-1, QK_TURBO)
    u = xb / np.sqrt(np.maximum((xb ** 2).mean(axis=1, keepdims=True), 1e-30))
    return float((u ** 4).mean())


def gaussian_reference(d, n=4096, seed=0):
    g = np.random.default_rng(seed).standard_normal((n, d)).astype(F32)
    return {t: rel_mse(g, t) for t in ("q4_0", "turbo4", "turbo3", "turbo2")}


def stats(args):
    """per-layer key statistics that explain the results (all KV heads, all tokens of the chunks)"""
    meta = read_meta(args.dump)
    model = Model(meta, args)
    T, H, Hkv = model.n_ctx, model.n_head, model.n_head_kv
    g = H // Hkv
    d = os.path.getsize(os.path.join(args.dump, "k_0_c0.f32")) // 4 // (T * Hkv)
    chunks = range(model.n_chunks) if args.chunks is None else [int(c) for c in args.chunks.split(",")]
    layers = range(model.n_layer) if args.layers is None else [int(x) for x in args.layers.split(",")]
    rot = default_rot(d)
    pos = np.arange(T)
    gref = gaussian_reference(d)
    print(f"{model.arch}, {model.pairing} RoPE, head_dim {d}, {H}/{Hkv} heads, Hadamard {rot}. Relative MSE "
          "sum|Q(x)-x|^2/sum|x|^2 on i.i.d. Gaussian rows: "
          + ", ".join(f"{t} {v:.4f}" for t, v in gref.items()) + "\n")
    print("Columns: pair-energy share of the top 4 pairs (keys), max/median pair energy; |k| of position 0 / "
          "median |k|; attention mass on position 0 (mean over queries and heads); per-channel mean's share of "
          "E|k|^2 pre- and post-RoPE; gain factors (1 = none, smaller is better) of the best per-pair scale "
          "G_pair = (sum_p sqrt(a_p b_p))^2/(sum a sum b) and of the best full matrix G_mat, on raw and "
          "post-RoPE-centered keys; kurtosis of the rotated, block-normalized key values (Gaussian 3); "
          "relative MSE of q4_0 / turbo4 / turbo3 on the real rotated keys (raw, and turbo3 centered). "
          "Total gains of post-RoPE centering + pair scale / + matrix, relative to raw keys: (1 - post share) "
          "x G_centered. pred t3/q4: the turbo3 / q4_0 q-weighted error ratio these imply for centering + "
          "matrix (MSE turbo3 / MSE q4_0 x that gain); 1 is the goal.\n")
    print("| layer | top-4 pairs share | max/med | pos0 norm ratio | attn on pos0 | mean share pre | post | "
          "G_pair | G_pair centered | G_mat | G_mat centered | kurtosis | MSE q4_0 | turbo4 | turbo3 | "
          "turbo3 centered | G center+pair | G center+mat | pred t3/q4 |")
    print("|" + "---|" * 19)
    tot = []
    for il in layers:
        r = {k: [] for k in ("top4", "mm", "bos", "att0", "mpre", "mpost", "gp", "gpc", "gm", "gmc", "kurt",
                             "q4", "t4", "t3", "t3c")}
        for c in chunks:
            kk = load(args.dump, "k", il, c, (T, Hkv, d))
            qq = load(args.dump, "q", il, c, (T, H, d))
            kp = load(args.dump, "kpre", il, c, (T, Hkv, d))
            for hk in range(Hkv):
                k = kk[:, hk].astype(np.float64)
                q = qq[:, hk * g:(hk + 1) * g].astype(np.float64)
                b = pair_energy(k, model.pairing)
                a = pair_energy(q, model.pairing)
                r["top4"].append(np.sort(b)[::-1][:4].sum() / b.sum())
                r["mm"].append(b.max() / np.median(b))
                nk = np.linalg.norm(k, axis=-1)
                r["bos"].append(nk[0] / np.median(nk[1:]))
                lg = np.einsum("tgd,sd->gts", q, k) / math.sqrt(d)
                lg = np.where(pos[None, None, :] <= pos[None, :, None], lg, -np.inf)
                lg -= lg.max(axis=-1, keepdims=True)
                p = np.exp(lg)
                r["att0"].append(float((p[:, :, 0] / p.sum(axis=-1)).mean()))
                e = (k ** 2).sum(axis=-1).mean()
                mpre = kp[:, hk].astype(np.float64).mean(axis=0)
                r["mpre"].append((mpre ** 2).sum() / (kp[:, hk].astype(np.float64) ** 2).sum(axis=-1).mean())
                mpost = k.mean(axis=0)
                r["mpost"].append((mpost ** 2).sum() / e)
                kc = k - mpost
                r["gp"].append(np.sqrt(a * b).sum() ** 2 / (a.sum() * b.sum()))
                bc = pair_energy(kc, model.pairing)
                r["gpc"].append(np.sqrt(a * bc).sum() ** 2 / (a.sum() * bc.sum()))
                qf = q.reshape(-1, d)
                sq = qf.T @ qf / len(qf)
                r["gm"].append(matrix_gain(k.T @ k / T, sq))
                r["gmc"].append(matrix_gain(kc.T @ kc / T, sq))
                kr = rotate(k.astype(F32), rot)
                r["kurt"].append(block_kurtosis(kr))
                r["q4"].append(rel_mse(kr, "q4_0"))
                r["t4"].append(rel_mse(kr, "turbo4"))
                r["t3"].append(rel_mse(kr, "turbo3"))
                r["t3c"].append(rel_mse(rotate(kc.astype(F32), rot), "turbo3") * (kc ** 2).sum() / (k ** 2).sum())
        m = {k: float(np.mean(v)) for k, v in r.items()}
        m["gcp"] = float(np.mean((1 - np.array(r["mpost"])) * np.array(r["gpc"])))
        m["gcm"] = float(np.mean((1 - np.array(r["mpost"])) * np.array(r["gmc"])))
        m["pred"] = m["t3"] / m["q4"] * m["gcm"]
        tot.append(m)
        print(f"| {il} | {m['top4']:.3f} | {m['mm']:.1f} | {m['bos']:.2f} | {m['att0']:.3f} | {m['mpre']:.3f} | "
              f"{m['mpost']:.3f} | {m['gp']:.3f} | {m['gpc']:.3f} | {m['gm']:.3f} | {m['gmc']:.3f} | {m['kurt']:.2f} | "
              f"{m['q4']:.4f} | {m['t4']:.4f} | {m['t3']:.4f} | {m['t3c']:.4f} | {m['gcp']:.3f} | {m['gcm']:.3f} | "
              f"{m['pred']:.2f} |")
    m = {k: float(np.mean([t[k] for t in tot])) for k in tot[0]}
    print(f"| mean | {m['top4']:.3f} | {m['mm']:.1f} | {m['bos']:.2f} | {m['att0']:.3f} | {m['mpre']:.3f} | "
          f"{m['mpost']:.3f} | {m['gp']:.3f} | {m['gpc']:.3f} | {m['gm']:.3f} | {m['gmc']:.3f} | {m['kurt']:.2f} | "
          f"{m['q4']:.4f} | {m['t4']:.4f} | {m['t3']:.4f} | {m['t3c']:.4f} | {m['gcp']:.3f} | {m['gcm']:.3f} | "
          f"{m['pred']:.2f} |")
    print("\n(turbo3 centered: error of the centered keys relative to the raw key energy, i.e. comparable with "
          "the raw columns.)")
    return 0


# ---------------------------------------------------------------------------------------------------
# end-to-end check of a *static* per-pair key scale: Gemma's q_norm / k_norm RMSNorm weights multiply
# Q and K per channel (shared by all heads) before RoPE, so q_norm *= s and k_norm /= s is exactly the
# transform q.k = (q*s).(k/s) (pair-shared s commutes with RoPE). A copy of the GGUF with those f32 weights
# rescaled can be run through llama-perplexity with turbo K to get a real KLD without touching llama.cpp.


def write_scaled_gguf(args):
    import shutil
    meta = read_meta(args.dump)
    T, H, Hkv, n_layer = int(meta["n_ctx"]), int(meta["n_head"]), int(meta["n_head_kv"]), int(meta["n_layer"])
    d = os.path.getsize(os.path.join(args.dump, "k_0_c0.f32")) // 4 // (T * Hkv)
    if Hkv != 1:
        raise SystemExit("the norm weights are shared by all KV heads: only one scale per layer can be baked in")
    src, dst = args.scaled_gguf
    cfg = parse_config("turbo3:scale=" + args.gguf_scale + ",calib=" + str(args.gguf_calib)
                       + (",nobos" if args.gguf_nobos else ""))
    tens = read_tensors(src)
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        for il in range(n_layer):
            k = load(args.dump, "k", il, args.gguf_chunk, (T, Hkv, d))[:, 0]
            q = load(args.dump, "q", il, args.gguf_chunk, (T, H, d))
            s = key_scale(cfg, k, q).astype(np.float64)
            sf = np.concatenate([s, s])
            for name, mul in ((f"blk.{il}.attn_q_norm.weight", sf), (f"blk.{il}.attn_k_norm.weight", 1.0 / sf)):
                t, dims, off = tens[name]
                if t != 0 or dims != [d]:
                    raise SystemExit(f"{name}: expected f32 [{d}], got type {t} dims {dims}")
                f.seek(off)
                w = np.frombuffer(f.read(4 * d), dtype="<f4").astype(np.float64)
                f.seek(off)
                f.write((w * mul).astype("<f4").tobytes())
            print(f"layer {il:2d}: s in [{s.min():.3f}, {s.max():.3f}]")
    print(f"wrote {dst}: q_norm *= s, k_norm /= s, s = {cfg['scale']} scale from the first {cfg['calib']} "
          f"tokens of chunk {args.gguf_chunk}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", default="/tmp/keystudy/dump", help="directory written by kv_dump")
    ap.add_argument("--config", action="append", default=[],
                    help="key configuration, e.g. turbo3:scale=smooth,calib=64 (repeatable)")
    ap.add_argument("--suite", choices=sorted(SUITES), help="a predefined list of configurations")
    ap.add_argument("--chunks", help="comma-separated chunk indices (default: all)")
    ap.add_argument("--layers", help="comma-separated layer indices (default: all)")
    ap.add_argument("--swa-pattern", type=int, default=None,
                    help="layers il %% P < P-1 are sliding-window (default: Gemma 3's 6 where the dump has a window)")
    ap.add_argument("--n-swa", type=int, default=None, help="sliding window (default: meta.txt, else Gemma 3 270M: 512)")
    ap.add_argument("--rope-base", type=float, default=None, help="RoPE base of the global layers (default: meta.txt, else 1e6)")
    ap.add_argument("--rope-base-swa", type=float, default=None, help="RoPE base of the sliding-window layers (default 1e4)")
    ap.add_argument("--rope-type", choices=("norm", "neox"), default=None,
                    help="RoPE pairing: norm (2i, 2i+1) or neox (i, i+d/2) (default: meta.txt, else neox)")
    ap.add_argument("--full-window", action="store_true", help="treat sliding-window layers as full attention")
    ap.add_argument("--attn-scale", type=float, default=0.0, help="query scale (default 1/sqrt(head_dim))")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the random signs (option signs)")
    ap.add_argument("--ref", default="q4_0", help="configuration the ratios are taken against")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--from-json", help="print the tables of a saved --json run instead of computing")
    ap.add_argument("--per-layer", help="semicolon-separated config names for a per-layer KL table")
    ap.add_argument("--validate-c", metavar="LIBGGML_BASE_SO", help="check the quantizers against the C code")
    ap.add_argument("--check-rope", action="store_true", help="check numpy RoPE against the dumped Kcur")
    ap.add_argument("--stats", action="store_true", help="per-layer key statistics")
    ap.add_argument("--scaled-gguf", nargs=2, metavar=("IN", "OUT"),
                    help="write a copy of the model with a static per-pair key scale baked into q_norm/k_norm")
    ap.add_argument("--gguf-scale", default="smooth", help="scale formula for --scaled-gguf")
    ap.add_argument("--gguf-calib", type=int, default=64, help="calibration tokens for --scaled-gguf (0 = all)")
    ap.add_argument("--gguf-chunk", type=int, default=0, help="dump chunk the --scaled-gguf scale comes from")
    ap.add_argument("--gguf-nobos", action="store_true", help="calibrate --scaled-gguf without the BOS token")
    args = ap.parse_args()

    if args.validate_c:
        return validate_c(args)
    if args.check_rope:
        return check_rope(args)
    if args.stats:
        return stats(args)
    if args.scaled_gguf:
        return write_scaled_gguf(args)

    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        res, info = saved["results"], saved["info"]
        info["layers"] = [int(x) for x in info["layers"]]
        info["windows"] = {int(k): v for k, v in info["windows"].items()}
        for r in res.values():
            r["per_layer"] = {int(k): v for k, v in r["per_layer"].items()}
        print("from", args.from_json, "run as:", " ".join(saved.get("argv", [])), "\n")
        print_table(res, info, ref=args.ref)
        if args.per_layer:
            print()
            print_per_layer(res, info, [n for n in args.per_layer.split(";") if n in res])
        return 0

    names = list(SUITES[args.suite]) if args.suite else []
    names += args.config
    if not names:
        names = SUITES["base"]
    if args.ref not in names:
        names.insert(0, args.ref)
    configs = [parse_config(n) for n in dict.fromkeys(names)]
    res, info = run_study(args, configs)
    print(f"{info['arch']}, {info['rope']} RoPE, heads {info['n_head']}/{info['n_head_kv']}, "
          f"layers {info['layers']}, chunks {info['chunks']}, ctx {info['n_ctx']}, head_dim {info['head_dim']}, "
          f"Hadamard {info['rot_default']}, windows {sorted(set(info['windows'].values()))}, "
          f"{info['seconds']:.0f} s\n")
    print_table(res, info, ref=args.ref)
    if args.per_layer:
        print()
        print_per_layer(res, info, [n for n in args.per_layer.split(";") if n in res])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": res, "argv": sys.argv}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
