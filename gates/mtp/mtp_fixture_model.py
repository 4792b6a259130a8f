"""Tiny Gemma-4 target + Gemma-4 assistant (MTP draft head) in plain PyTorch.

The modules below mirror, op for op, what llama.cpp b11312 computes in
vendor/llama.cpp/src/models/gemma4.cpp (target) and
vendor/llama.cpp/src/models/gemma4-assistant.cpp (draft head), so that the
weights trained here and exported to GGUF give the same logits there:

- embeddings scaled by sqrt(n_embd); LM head tied to token_embd; target logits
  soft-capped 30*tanh(x/30) (Gemma default; the assistant head has no cap)
- RMSNorm x * rsqrt(mean(x^2) + eps) * w (Gemma4: no "+1" shift)
- attention scale 1.0, q_norm/k_norm with weights, v rms-normed without weight
- NEOX RoPE; full-attention layers use the 'proportional' rope through
  rope_freqs (1.0 for rotated pairs, 1e30 for the rest), SWA layers rope all dims
- standard SWA mask: key visible iff 0 <= q_pos - k_pos < n_swa
- FFN: down(gelu_tanh(gate(x)) * up(x)); post-attn / post-ffw norms; layer_output_scale
- target h_nextn = post-final-norm hidden state (what the draft receives)
- assistant: x = concat(target_embd(tok) * sqrt(n_embd_tgt), h) -> pre_projection,
  Q-only layers attending to the target's KV of layer n-2 (SWA) / n-1 (full),
  output_norm, logits = own token_embd, h_next = post_projection(normed)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- vocab ----
# byte-level ids (mtp_vocab.py), padded so that n_vocab divides evenly into centroid clusters
N_VOCAB = 288


# ---------------------------------------------------------------- configs ----
# A config's field order is the key order cfg_dict gives MANIFEST.json: its widths, then the
# layer stack's fields, then its own (dataclass fields follow the bases' reversed MRO).
@dataclass
class _LayerStackCfg:
    """The layers both models are made of. The assistant attends to the target's own K/V, so the
    attention geometry and RoPE are the target's in both."""
    layer_types: list = field(default_factory=list)
    n_head: int = 4
    hd_swa: int = 64   # turbo KV blocks are 64 values: head sizes must be multiples of 64 (gate mtp runs turbo3)
    hd_full: int = 64
    nkv_swa: int = 2
    nkv_full: int = 1
    n_ff: int = 256
    eps: float = 1e-6
    base_full: float = 1_000_000.0
    base_swa: float = 10_000.0
    partial_full: float = 0.25
    n_swa: int = 64
    n_ctx: int = 2048

    @property
    def n_layer(self):
        return len(self.layer_types)


@dataclass
class _TargetWidths:
    n_vocab: int = N_VOCAB
    d: int = 128


@dataclass
class TargetCfg(_LayerStackCfg, _TargetWidths):
    layer_types: list = field(default_factory=lambda: ["sliding_attention"] * 3 + ["full_attention"])
    # llama.cpp applies 30.0 when gemma4.final_logit_softcapping is absent (llama-hparams.h:137);
    # we train with it and write the key explicitly
    final_softcap: float = 30.0


@dataclass
class _AssistantWidths:
    n_vocab: int = N_VOCAB
    d: int = 64
    d_backbone: int = 128  # the target's d: the width of the hidden state it receives


@dataclass
class AssistantCfg(_LayerStackCfg, _AssistantWidths):
    layer_types: list = field(default_factory=lambda: ["sliding_attention", "full_attention"])
    n_ff: int = 512   # the head has to replay the memorised text on its own for 8 steps
    num_centroids: int = 32
    centroid_top_k: int = 4


def rope_freq_factors(hd_full: int, partial: float) -> torch.Tensor:
    n_rot = int(hd_full * partial / 2)
    return torch.tensor([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=torch.float32)


# ---------------------------------------------------------------- ops ----
def rms(x, w, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if w is None else x * w


def rope_neox(x, pos, base, ff=None):
    """x [B,T,H,hd], pos [B,T] (int). n_rot = hd (ggml neox with freq factors)."""
    hd = x.shape[-1]
    half = hd // 2
    inv = base ** (-torch.arange(half, dtype=torch.float32) * 2.0 / hd)
    if ff is not None:
        inv = inv / ff
    ang = pos.to(torch.float32)[..., None] * inv  # [B,T,half]
    cos = ang.cos()[:, :, None, :]
    sin = ang.sin()[:, :, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


def attend(q, k, v, mask):
    """q [B,T,H,hd], k/v [B,S,KVH,hd], mask [B or 1,T,S] bool (True = visible). scale 1.0."""
    H, KVH = q.shape[2], k.shape[2]
    if H != KVH:
        k = k.repeat_interleave(H // KVH, dim=2)
        v = v.repeat_interleave(H // KVH, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k)
    s = s.masked_fill(~mask[:, None, :, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("bhts,bshd->bthd", p, v)


def causal_masks(qpos, kpos, n_swa, strict=False):
    """qpos [B,T], kpos [S] -> (full, swa) bool masks [B,T,S].
    strict=True: only keys with k_pos < q_pos (draft reading the target's KV)."""
    diff = qpos[:, :, None] - kpos[None, None, :]
    full = diff > 0 if strict else diff >= 0
    swa = full & (diff < n_swa)
    return full, swa


def layer_out(L, x, a, eps):
    """The part target and assistant layers share: output projection of the attention a, post-attention
    norm, residual, gated-GELU FFN with its post norm, residual, layer output scale."""
    a = rms(L.wo(a), L.post_attn_norm, eps)
    x = x + a
    f = rms(x, L.ffn_norm, eps)
    f = L.down(F.gelu(L.gate(f), approximate="tanh") * L.up(f))
    f = rms(f, L.ffn_post_norm, eps)
    return (x + f) * L.out_scale


def ones(n):
    return nn.Parameter(torch.ones(n))


def add_layer_stack(m, c, layer_cls):
    """The layers, the output norm and the full-attention RoPE factors, last in both models:
    registration order is parameter order, which training and export depend on."""
    m.layers = nn.ModuleList([layer_cls(c, t == "sliding_attention") for t in c.layer_types])
    m.out_norm = ones(c.d)
    m.register_buffer("ff", rope_freq_factors(c.hd_full, c.partial_full))


def add_layer_out(L, c):
    """The weights layer_out uses, made in one order for both layer kinds (the same random draws)."""
    L.post_attn_norm = ones(c.d)
    L.ffn_norm = ones(c.d)
    L.gate = nn.Linear(c.d, c.n_ff, bias=False)
    L.up = nn.Linear(c.d, c.n_ff, bias=False)
    L.down = nn.Linear(c.n_ff, c.d, bias=False)
    L.ffn_post_norm = ones(c.d)
    L.register_buffer("out_scale", torch.ones(1))


# ---------------------------------------------------------------- target ----
class TLayer(nn.Module):
    def __init__(self, c: TargetCfg, swa: bool):
        super().__init__()
        self.swa = swa
        hd = c.hd_swa if swa else c.hd_full
        nkv = c.nkv_swa if swa else c.nkv_full
        self.hd, self.nkv = hd, nkv
        self.attn_norm = ones(c.d)
        self.wq = nn.Linear(c.d, c.n_head * hd, bias=False)
        self.wk = nn.Linear(c.d, nkv * hd, bias=False)
        self.wv = nn.Linear(c.d, nkv * hd, bias=False)
        self.wo = nn.Linear(c.n_head * hd, c.d, bias=False)
        self.q_norm = ones(hd)
        self.k_norm = ones(hd)
        add_layer_out(self, c)


class _Model(nn.Module):
    """What both models start with: their config and the token embedding (the assistant's LM
    head too, tied), created first so the random draws stay in the fixture's order."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embd = nn.Parameter(torch.randn(c.n_vocab, c.d) * 0.02)


class Target(_Model):
    def __init__(self, c: TargetCfg):
        super().__init__(c)
        add_layer_stack(self, c, TLayer)

    def embed(self, tok):
        return self.embd[tok] * math.sqrt(self.c.d)

    def forward(self, tok, want_kv=False):
        c = self.c
        B, T = tok.shape
        pos = torch.arange(T)[None, :].expand(B, T)
        m_full, m_swa = causal_masks(pos[:1], torch.arange(T), c.n_swa)
        x = self.embed(tok)
        kvs = []
        for L in self.layers:
            h = rms(x, L.attn_norm, c.eps)
            q = L.wq(h).view(B, T, c.n_head, L.hd)
            k = L.wk(h).view(B, T, L.nkv, L.hd)
            v = L.wv(h).view(B, T, L.nkv, L.hd)
            q = rms(q, L.q_norm, c.eps)
            k = rms(k, L.k_norm, c.eps)
            v = rms(v, None, c.eps)
            base = c.base_swa if L.swa else c.base_full
            ff = None if L.swa else self.ff
            q = rope_neox(q, pos, base, ff)
            k = rope_neox(k, pos, base, ff)
            kvs.append((k, v))
            a = attend(q, k, v, m_swa if L.swa else m_full)
            x = layer_out(L, x, a.reshape(B, T, -1), c.eps)
        hn = rms(x, self.out_norm, c.eps)
        logits = hn @ self.embd.t()
        if c.final_softcap:
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        if want_kv:
            n = c.n_layer
            # llama.cpp gemma4-assistant share(): SWA -> target layer n-2, full -> n-1
            assert c.layer_types[n - 1] == "full_attention" and c.layer_types[n - 2] == "sliding_attention"
            return logits, hn, {"swa": kvs[n - 2], "full": kvs[n - 1]}
        return logits, hn


# ---------------------------------------------------------------- assistant ----
class ALayer(nn.Module):
    def __init__(self, c: AssistantCfg, swa: bool):
        super().__init__()
        self.swa = swa
        hd = c.hd_swa if swa else c.hd_full
        self.hd = hd
        self.attn_norm = ones(c.d)
        self.wq = nn.Linear(c.d, c.n_head * hd, bias=False)
        self.wo = nn.Linear(c.n_head * hd, c.d, bias=False)
        self.q_norm = ones(hd)
        add_layer_out(self, c)


class Assistant(_Model):
    def __init__(self, c: AssistantCfg):
        super().__init__(c)
        self.pre_proj = nn.Linear(2 * c.d_backbone, c.d, bias=False)
        self.post_proj = nn.Linear(c.d, c.d_backbone, bias=False)
        add_layer_stack(self, c, ALayer)
        # centroid (ordered-embedding) head, trained after the dense head
        self.centroids = nn.Linear(c.d, c.num_centroids, bias=False)
        self.register_buffer("ordering", torch.arange(c.n_vocab, dtype=torch.long))

    def step(self, e_tgt, h, pos, kv, masks):
        """e_tgt: target embd(tok)*sqrt(d_tgt) [B,P,Dt]; h [B,P,Dt]; pos [B,P];
        kv {'swa': (K,V), 'full': (K,V)} from the target; masks {'swa','full'} [B,P,S].
        Returns logits [B,P,V], h_next [B,P,Dt], normed hidden [B,P,d]."""
        c = self.c
        B, P, _ = e_tgt.shape
        x = self.pre_proj(torch.cat([e_tgt, h], dim=-1))
        for L in self.layers:
            hh = rms(x, L.attn_norm, c.eps)
            q = L.wq(hh).view(B, P, c.n_head, L.hd)
            q = rms(q, L.q_norm, c.eps)
            base = c.base_swa if L.swa else c.base_full
            q = rope_neox(q, pos, base, None if L.swa else self.ff)
            k, v = kv["swa" if L.swa else "full"]
            a = attend(q, k, v, masks["swa" if L.swa else "full"])
            x = layer_out(L, x, a.reshape(B, P, -1), c.eps)
        y = rms(x, self.out_norm, c.eps)
        return y @ self.embd.t(), self.post_proj(y), y

    def centroid_logits(self, y):
        """HF Gemma4AssistantMaskedEmbedder: logits only over the top-k clusters."""
        c = self.c
        K = c.n_vocab // c.num_centroids
        cl = self.centroids(y)
        top = cl.topk(c.centroid_top_k, dim=-1).indices  # [...,k]
        sel = self.ordering.view(c.num_centroids, K)[top].flatten(-2)  # [..., k*K]
        lg = torch.einsum("...d,...nd->...n", y, self.embd[sel])
        out = torch.full((*y.shape[:-1], c.n_vocab), float(lg.min()) - 1.0)
        return out.scatter(-1, sel, lg)


def cfg_dict(c):
    return asdict(c)
