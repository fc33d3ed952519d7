"""The reference text diffusion LM: a compact transformer denoiser in the spirit of Diffusion-LM.

One architecture serves both default models:

* ``kind="masked"``: input tokens with an absorbing ``[MASK]``; not time-conditioned by default
  (as MDLM), which lets a strategy reuse a whole forward pass exactly when nothing changed.
* ``kind="continuous"``: input is a noisy point in a normalised token-embedding space (CDCD /
  Diffusion-LM); time-conditioned; trained with cross-entropy on the clean tokens.

Every block is modulated by a condition vector (time embedding, optional external condition,
and a learned bias): scale, shift and gate per block, so the condition acts at every step.
Blocks can run on a subset of positions while the rest serve keys and values from a cache:
that is what makes per-position strategies cost less (see ``Block.forward``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from .positions import Positions

__all__ = ["SCHEDULES", "Block", "KVCache", "TextDiffusionConfig", "TextDiffusionLM", "alphas_cumprod", "apply_rope",
           "attend_positions", "mask_rate", "rope_tables", "timestep_embedding", "write_positions"]

SCHEDULES = ("linear", "cosine", "scaled-linear")


@attrs.frozen(kw_only=True)
class TextDiffusionConfig:
    vocab_size: int
    """Number of tokens, special tokens included."""
    kind: str = attrs.field(default="masked", validator=attrs.validators.in_(("masked", "continuous")))
    """``masked`` (absorbing state) or ``continuous`` (embedding space)."""
    max_len: int = 128
    """Longest sequence, in tokens (learned positions)."""
    dim: int = 256
    """Width of the transformer."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention heads per block."""
    mlp_ratio: int = 4
    """Width of the MLP, as a multiple of ``dim``."""
    time_conditioned: bool = False
    """Feed the time step into the condition vector (always on for continuous models)."""
    cond_dim: int = 0
    """Size of an external condition vector (0: none)."""
    embed_dim: int = 64
    """Continuous models: size of the normalised token-embedding space that is noised."""
    latent_norm: float | None = None
    """Continuous models: norm of every token's latent (default sqrt(embed_dim), unit variance per
    dimension). Smaller puts more of the schedule where noise hides the token."""
    frozen_embed_dim: int = 0
    """Masked models: width of a frozen token-embedding table (from a pretrained BERT), projected
    to ``dim`` by a learned linear map; 0 learns the embeddings from scratch."""
    logit_clip: float = 10.0
    """Output logits are softly bounded to (-logit_clip, logit_clip)."""
    schedule: str = attrs.field(default="cosine", validator=attrs.validators.in_(SCHEDULES))
    """Noise schedule: linear, cosine or scaled-linear."""
    num_timesteps: int = 1000
    """Continuous models: number of discrete training time steps."""
    mask_id: int = 2
    """Id of ``[MASK]``."""
    pad_id: int = 0
    """Id of ``[PAD]``."""

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "TextDiffusionConfig":
        return cls(**json.loads(text))


# ---- noise schedules ----------------------------------------------------------------------

def mask_rate(schedule: str, t: torch.Tensor) -> torch.Tensor:
    """Masked diffusion: fraction of tokens masked at continuous time t in [0, 1]."""
    if schedule == "linear":
        return t
    if schedule == "cosine":
        return 1.0 - torch.cos(0.5 * math.pi * t)
    if schedule == "scaled-linear":
        return t.pow(2)
    raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")


def alphas_cumprod(schedule: str, num_timesteps: int) -> torch.Tensor:
    """Continuous diffusion: cumulative product of alphas, shape (T,), decreasing from ~1."""
    T = num_timesteps
    if schedule == "linear":
        betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    elif schedule == "scaled-linear":
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, T, dtype=torch.float64) ** 2
    elif schedule == "cosine":
        s = 0.008
        x = torch.linspace(0, T, T + 1, dtype=torch.float64)
        ac = torch.cos(((x / T) + s) / (1 + s) * math.pi * 0.5) ** 2
        betas = (1 - ac[1:] / ac[:-1]).clamp(max=0.999)
    else:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    return torch.cumprod(1.0 - betas, dim=0).float()


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


# ---- the network --------------------------------------------------------------------------

class KVCache:
    """Keys and values of one layer for every position, refreshed where the layer last ran.

    ``k`` and ``v`` are (B, Hkv, N, dh) each (None before the first step). A denoiser's full
    ``block`` call sets both (a view of its projection is fine); a partial call writes its
    positions' rows in place (``attend_positions`` does, and makes them contiguous once). The
    pipeline keeps one per layer for a generation and writes a finished prefix into them
    (``prefix_cache``), so the layout is part of the protocol."""

    __slots__ = ("k", "v")

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None


def write_positions(k: torch.Tensor, v: torch.Tensor, kv: KVCache, sel: Positions) -> None:
    """Write the keys and values ``k``, ``v`` (T, Hkv, dh) of the T positions ``sel`` into ``kv``
    (B, Hkv, N, dh each) in place, one ``index_copy_`` per tensor: the cache duty of a partial
    step whose attention is not ``attend_positions``' (an additive bias: DeBERTa)."""
    T, Hkv, dh = k.shape
    # a full step leaves the values as a strided view of its qkv product: make them one block once
    if not kv.k.is_contiguous():
        kv.k = kv.k.contiguous()
    if not kv.v.is_contiguous():
        kv.v = kv.v.contiguous()
    rows = sel.kv_index(Hkv)
    kv.k.view(-1, dh).index_copy_(0, rows, k.reshape(T * Hkv, dh))
    kv.v.view(-1, dh).index_copy_(0, rows, v.reshape(T * Hkv, dh))


def attend_positions(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache, sel: Positions,
                     scale: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for the T positions ``sel`` of a partial step: their keys and values ``k``, ``v``
    (T, Hkv, dh) are written into ``kv`` (B, Hkv, N, dh each) in place, one ``index_copy_`` per tensor,
    and their queries ``q`` (T, H, dh) attend over every position of their row. Returns (T, H * dh).
    Queries are padded to the longest row for the one attention call only; rows with no
    position (finished rows) are not in it.

    ``mask``: which keys each query position may attend to, a (N, N) bool tensor indexed
    [query position, key position] (True: attend), the same the full step passes to its own
    attention (a sliding window: ``(i - j).abs() <= w``); None: every position."""
    T, H, dh = q.shape
    Hkv = k.shape[1]  # fewer than H with grouped-query attention: each serves H / Hkv query heads
    write_positions(k, v, kv, sel)
    allowed = None
    if mask is not None:  # each query's row of the mask; padded queries may attend anywhere (no NaN)
        allowed = (~sel.pad(~mask.index_select(0, sel.pos)))[:, None]  # (L, 1, M, N)
    a = F.scaled_dot_product_attention(sel.pad(q).transpose(1, 2), sel.live_rows(kv.k), sel.live_rows(kv.v), scale=scale,
                                       attn_mask=allowed, enable_gqa=Hkv != H)  # (L, H, M, dh)
    return sel.unpad(a.transpose(1, 2)).reshape(T, H * dh)


def rope_tables(max_len: int, head_dim: int) -> torch.Tensor:
    """Rotations e^(i * pos * freq) per position and frequency, (max_len, head_dim / 2) complex64."""
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None]
    return torch.polar(torch.ones_like(ang), ang)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (..., M, dh): each pair (x[2j], x[2j+1]) is one complex number
    turned by ``rot`` (..., M, dh/2), broadcast over the leading dimensions. One complex product
    instead of the six real ops and a stack of the textbook form: at the partial steps' few rows
    the op count, not the arithmetic, is the cost."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int, max_len: int = 128):
        super().__init__()
        self.heads = heads
        # rotary positions give attention a local bias from the first step (learned absolute
        # positions alone left small models on the unigram plateau for hundreds of steps)
        self.register_buffer("rope", rope_tables(max_len, dim // heads), persistent=False)
        self.ln1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)
        # condition gating: shift, scale, gate for attention and MLP, zero-initialised
        self.mod = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.mod.weight)
        nn.init.zeros_(self.mod.bias)

    def modulation(self, c: torch.Tensor) -> torch.Tensor:
        """(B, 6, D) from the condition c (B, D): shift1, 1 + scale1, gate1, shift2, 1 + scale2,
        gate2 per row. A function of c alone: a caller whose c does not change between steps
        computes it once (``ReferenceDenoiser`` does); one tensor, so a partial step takes each
        computed position's six vectors with one gather."""
        m = self.mod(F.silu(c)).view(c.shape[0], 6, -1)
        m[:, 1] += 1
        m[:, 4] += 1
        return m

    def forward(self, x: torch.Tensor, c: torch.Tensor, kv: KVCache | None = None, positions: Positions | None = None,
                mods: torch.Tensor | None = None):
        """Run the block.

        Without ``positions``, ``x`` is (B, N, D), every position; ``kv`` (when given) is refilled.
        With ``positions`` (T pairs of a (B, N) batch), ``x`` is (T, D), those positions' inputs:
        queries come from them only, their fresh keys and values are written into ``kv`` and
        attention reads every position from ``kv``, so the cost scales with T. ``mods`` is
        ``modulation(c)`` when the caller has it already.
        """
        m = mods if mods is not None else self.modulation(c)
        h, D = self.heads, x.shape[-1]
        if positions is None:
            B, N, _ = x.shape
            m = m[:, None]  # (B, 1, 6, D): broadcast over positions
            qkv = self.qkv(torch.addcmul(m[..., 0, :], self.ln1(x), m[..., 1, :])).view(B, N, 3, h, D // h).permute(2, 0, 3, 1, 4)
            qk = apply_rope(qkv[:2], self.rope[:N])  # queries and keys turned together
            q, k, v = qk[0], qk[1], qkv[2]
            if kv is not None:
                kv.k, kv.v = k, v
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        else:
            T = x.shape[0]
            m = m.index_select(0, positions.rows) if m.shape[0] > 1 else m  # (T or 1, 6, D)
            qkv = self.qkv(torch.addcmul(m[:, 0], self.ln1(x), m[:, 1])).view(T, 3, h, D // h).transpose(0, 1)
            qk = apply_rope(qkv[:2], self.rope.index_select(0, positions.pos)[:, None])
            a = attend_positions(qk[0], qk[1], qkv[2], kv, positions)
        x = torch.addcmul(x, m[..., 2, :], self.proj(a))
        return torch.addcmul(x, m[..., 5, :], self.fc2(F.gelu(self.fc1(torch.addcmul(m[..., 3, :], self.ln2(x), m[..., 4, :])))))


class TextDiffusionLM(nn.Module):
    def __init__(self, config: TextDiffusionConfig):
        super().__init__()
        self.config = cfg = config
        D = cfg.dim
        if cfg.kind == "masked":
            if cfg.frozen_embed_dim:
                self.tok_emb = nn.Sequential(nn.Embedding(cfg.vocab_size, cfg.frozen_embed_dim), nn.Linear(cfg.frozen_embed_dim, D))
                self.tok_emb[0].weight.requires_grad_(False)
            else:
                self.tok_emb = nn.Embedding(cfg.vocab_size, D)
                nn.init.normal_(self.tok_emb.weight, std=0.02)  # same scale as positions, as in GPT-2
        else:
            self.latent_emb = nn.Parameter(torch.randn(cfg.vocab_size, cfg.embed_dim))
            self.in_proj = nn.Linear(cfg.embed_dim, D)
            self.register_buffer("alphas_cumprod", alphas_cumprod(cfg.schedule, cfg.num_timesteps), persistent=False)
        self.pos_emb = nn.Parameter(torch.randn(cfg.max_len, D) * 0.02)
        self.cond_bias = nn.Parameter(torch.zeros(D))
        self.uses_time = cfg.time_conditioned or cfg.kind == "continuous"
        if self.uses_time:
            self.time_mlp = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D))
        if cfg.cond_dim:
            self.cond_proj = nn.Linear(cfg.cond_dim, D)
        self.blocks = nn.ModuleList([Block(D, cfg.n_heads, cfg.mlp_ratio, cfg.max_len) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, cfg.vocab_size)

    # -- pieces the adapter drives one by one --
    def token_latents(self) -> torch.Tensor:
        """Continuous models: the normalised embedding of every token, (V, E), scaled to unit variance."""
        norm = self.config.latent_norm or math.sqrt(self.config.embed_dim)
        return F.normalize(self.latent_emb, dim=-1) * norm

    def embed(self, x: torch.Tensor, positions: Positions | None = None) -> torch.Tensor:
        """Input embedding of tokens (B, N) or latents (B, N, E): (B, N, D); with ``positions``,
        of those positions only, (T, D)."""
        if positions is not None:
            # index_select: advanced indexing costs several times more on these few rows
            x = x.reshape(-1).index_select(0, positions.flat) if x.dim() == 2 else positions.gather(x)
            pos = self.pos_emb.index_select(0, positions.pos)
        else:
            pos = self.pos_emb[: x.shape[1]].unsqueeze(0)
        # continuous latents stay float32 in the sampler (its DDIM/DDPM updates); the model reads them in its dtype
        h = self.tok_emb(x) if self.config.kind == "masked" else self.in_proj(x.to(self.in_proj.weight.dtype))
        return h + pos

    def condition(self, t: torch.Tensor | None, batch: int, cond: torch.Tensor | None = None) -> torch.Tensor:
        """Condition vector (B, D): learned bias + time embedding + projected external condition.

        ``cond`` is (B, cond_dim); a row whose vector is all zeros gets no projection at all
        (exactly the unconditioned model for that row), so a strategy can drop one row's condition."""
        c = self.cond_bias.expand(batch, -1)
        if self.uses_time:
            if t is None:
                raise ValueError("this model is time-conditioned: pass the time step")
            t = t.expand(batch) if t.dim() == 0 or t.numel() == 1 else t
            # the sinusoid is formed in float32 (large arguments), then meets the MLP in its dtype
            emb = timestep_embedding(t.reshape(batch), self.config.dim)
            c = c + self.time_mlp(emb.to(self.cond_bias.dtype))
        if cond is not None and self.config.cond_dim:
            c = c + self.cond_proj(cond.to(c.dtype)) * cond.ne(0).any(-1, keepdim=True)
        return c

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        clip = self.config.logit_clip
        y = self.head(self.ln_f(h))
        if torch.is_grad_enabled():
            return clip * torch.tanh(y / clip)
        # sampling: the same arithmetic in place, sparing two (B, N, V) buffers per step
        return y.div_(clip).tanh_().mul_(clip)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, cond: torch.Tensor | None = None) -> torch.Tensor:
        """Full forward pass: logits (B, N, V)."""
        c = self.condition(t, x.shape[0], cond)
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, c)
        return self.logits(h)

    # -- persistence --
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(self.config.to_json())
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(d / "model.safetensors"))

    @classmethod
    def load(cls, directory: str | Path) -> "TextDiffusionLM":
        d = Path(directory)
        model = cls(TextDiffusionConfig.from_json((d / "config.json").read_text()))
        state = load_file(str(d / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()})
        return model.eval()
