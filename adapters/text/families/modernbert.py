"""ModernBERT as a text model kind: the text adapter's worked example (docs/writing-an-adapter.md).

A text model kind is two objects: a denoiser (the text-model protocol,
``diffaccel.adapters.text.protocol.TextDenoiser``) that runs the model one layer at a time, on
every position or on a subset of them, and a loader (``Loader``) that recognises a checkpoint,
loads it, and reads its facts without the weights. This module uses the public pieces only
(``diffaccel.adapters.text.protocol``, ``diffaccel.adapters.checkpoints``) and is shipped as one
of the text adapter's loaders; a third party registers the same ``KIND`` object as an entry point
of the ``diffaccel.text_models`` group, with no edit of diffaccel::

    [project.entry-points."diffaccel.text_models"]
    modernbert = "my_package.modernbert:KIND"

ModernBERT (``ModernBertForMaskedLM``): pre-norm layers, rotary positions with one table per
layer type, global layers and sliding-window layers (a query attends to the keys within
``sliding_window`` positions), a final norm before the head. The denoiser reads the transformers
module's own weights (nothing is copied), so its forward is transformers' own, to the last bit
(tests/test_text_families.py checks it to 1e-5, and partial steps against full ones).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffaccel.adapters.checkpoints import check_loading_info, check_vocab, precheck_folder, quiet_loading
from diffaccel.adapters.text.families.protocol import (HFTokenizer, KVCache, Loaded, ModelFacts, Positions, Source,
                                                       attend_positions)
from diffaccel.contract.errors import ModelLoadError

__all__ = ["KIND", "ModernBertDenoiser", "ModernBertKind"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ModernBertDenoiser:
    """A ``ModernBertForMaskedLM`` as a masked denoiser (MDLM-style: not time-conditioned)."""

    # the facts the pipeline and the strategies read
    kind = "masked"  # absorbing-state diffusion: the masked sampler
    time_conditioned = False  # the same input gives the same output at every step
    cond_dim = 0  # no external condition vector

    def __init__(self, model, mask_id: int, special_ids: set[int]):
        cfg = model.config
        self.model = model.eval()  # the pipeline moves and casts it (pipe.to)
        self.base = model.model
        self.layers = list(self.base.layers)
        self.n_layers = len(self.layers)
        self.vocab_size = cfg.vocab_size
        self.max_len = cfg.max_position_embeddings
        self.mask_id = mask_id
        self.special_ids = special_ids  # never drawn by the sampler
        self.heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.types = list(cfg.layer_types)  # "full_attention" or "sliding_attention", per layer
        self.window = int(cfg.sliding_window)
        self._masks: dict[tuple[int, str], torch.Tensor] = {}

    def condition(self, t, batch: int, cond=None):
        return None  # not time-conditioned: nothing to compute per step

    def embed(self, x: torch.Tensor, positions: Positions | None = None) -> torch.Tensor:
        """Token ids (B, N) -> (B, N, D); with ``positions``, those positions' only, (T, D).
        Positions enter through the rotary tables, so the embedding reads the ids alone."""
        if positions is None:
            return self.base.embeddings(input_ids=x)
        return self.base.embeddings(input_ids=x.reshape(-1).index_select(0, positions.flat)[None])[0]

    def mask(self, i: int, n: int, device) -> torch.Tensor | None:
        """Layer i's attention mask over n positions, (n, n) bool [query, key]; None: global.
        The full and the partial paths pass the same one (the conformance suite's ``partial``
        check fails a partial path that drops it)."""
        if self.types[i] != "sliding_attention":
            return None
        key = (n, str(device))
        if key not in self._masks:  # one per length and device, shared by every sliding layer
            idx = torch.arange(n, device=device)
            self._masks[key] = (idx[:, None] - idx[None, :]).abs() <= self.window
        return self._masks[key]

    def _qkv(self, i: int, h: torch.Tensor, pos: torch.Tensor):
        """Queries, keys, values (*lead, heads, head_dim), rotated at positions ``pos``: (N,) on a
        full step (the same for every row), (T,) on a partial one."""
        layer = self.layers[i]
        qkv = layer.attn.Wqkv(layer.attn_norm(h)).view(*h.shape[:-1], 3, self.heads, self.head_dim)
        q, k, v = qkv.unbind(-3)
        cos, sin = self.base.rotary_emb(h, pos[None], self.types[i])  # (1, N or T, head_dim)
        cos, sin = (t.view(*pos.shape, 1, -1) for t in (cos, sin))  # broadcast over the heads
        q, k = ((x.float() * cos + _rotate_half(x.float()) * sin).to(x.dtype) for x in (q, k))
        return q, k, v

    def block(self, i: int, h: torch.Tensor, c, kv: KVCache, positions: Positions | None = None) -> torch.Tensor:
        """Layer i. Full: h (B, N, D), every position; its keys and values (B, heads, N, head_dim)
        go into ``kv``. Partial: h (T, D), the inputs at ``positions``; their keys and values
        are written into ``kv`` at those positions and their queries attend over every cached
        key (``attend_positions``), so the cost follows T."""
        layer = self.layers[i]
        if positions is None:
            B, N = h.shape[:2]
            q, k, v = (t.transpose(1, 2) for t in self._qkv(i, h, torch.arange(N, device=h.device)))
            kv.k, kv.v = k, v
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(i, N, h.device))
            ctx = ctx.transpose(1, 2).reshape(B, N, -1)
        else:
            q, k, v = self._qkv(i, h, positions.pos)
            ctx = attend_positions(q, k, v, kv, positions, mask=self.mask(i, kv.k.shape[2], h.device))
        h = h + layer.attn.Wo(ctx)
        return h + layer.mlp(layer.mlp_norm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., D) -> logits (..., V): (B, N, D) on full steps, (T, D) on partial ones."""
        m = self.model
        return m.decoder(m.head(self.base.final_norm(h)))


class ModernBertKind:
    """The loader: recognises a config.json with ``model_type = "modernbert"`` (a local folder or
    a hub id), loads it with transformers, and reads its facts from the config alone."""

    names = ()  # no shipped checkpoint names
    model_types = ("modernbert",)  # the families it runs, listed where another family is refused

    def recognises(self, source: Source) -> bool:
        return source.config().get("model_type") in self.model_types

    def load(self, source: Source) -> Loaded:
        from transformers import AutoTokenizer, ModernBertForMaskedLM  # seconds to import: deferred to a load

        local = source.path is not None
        if local:  # safetensors only (a pickle only with allow_pickle), whole files, before transformers reads them
            precheck_folder(source.path, source.allow_pickle)
        try:
            with quiet_loading():
                model, info = ModernBertForMaskedLM.from_pretrained(source.checkpoint, output_loading_info=True,
                                                                    use_safetensors=None if source.allow_pickle else True)
                tok = AutoTokenizer.from_pretrained(source.checkpoint)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"checkpoint '{source.checkpoint}': transformers could not load it ({exc})") from None
        where = source.path if local else source.checkpoint
        check_loading_info(info, where)  # missing or unexpected tensors: one line
        if tok.mask_token_id is None:
            raise ModelLoadError(f"checkpoint '{source.checkpoint}': its tokenizer has no mask token; a masked LM is needed")
        check_vocab(tok.vocab_size, model.get_input_embeddings().num_embeddings, where, exact=False, with_added=len(tok))
        den = ModernBertDenoiser(model, tok.mask_token_id, set(tok.all_special_ids))
        return Loaded(denoiser=den, tokenizer=HFTokenizer(tok), name=source.name, weights=model, where=where,
                      model_kind="modernbert")

    def facts(self, source: Source) -> ModelFacts:
        from transformers import AutoConfig  # the config's defaults filled in, as the load reads them

        try:
            cfg = AutoConfig.from_pretrained(source.checkpoint)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"checkpoint '{source.checkpoint}': transformers could not read its config ({exc})") from None
        return ModelFacts("masked", cfg.vocab_size, cfg.num_hidden_layers, cfg.max_position_embeddings)


KIND = ModernBertKind()
