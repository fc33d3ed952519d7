"""The ``topk`` strategy: top-k sampling and top-k logit truncation for text diffusion LMs.

* Truncation (``k_keep``): after each denoiser step, each position keeps its ``k_keep`` largest
  logits and the rest become -inf. The strategy holds those as (values, indices), ``k_keep`` per
  position, in ``run.state(strategy)["values"/"indices"]``, and hands the sampler and later
  strategies those same two tensors as a ``TopKLogits`` (the text samplers draw, rank and
  estimate from the k_keep values; ``.dense()`` gives the (B, N, V) form with -inf elsewhere).
* Top-k sampling: each token is drawn from its ``k`` most probable tokens, renormalised at
  ``temperature``, with the Gumbel-max trick (argmax of logit / T + Gumbel noise is a draw from
  softmax(logit / T)). Noise comes from one ``torch.Generator`` per batch row seeded from the
  row's seed, so a row draws the same tokens alone or in a batch.

  - ``at_finalize``: the positions the default would fill by argmax (all generated positions of
    the continuous samplers; still-masked positions of the masked sampler) are drawn instead.
  - ``at_steps`` (masked sampler, run at temperature 0): at each step the returned logits are
    arranged so that the sampler's argmax *is* a top-k draw; ``rank`` chooses how the sampler's
    confidence, which orders the commits, comes out (see ``TopKConfig.rank``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import attrs
import torch

from diffaccel import hookimpl
from diffaccel.contract.errors import ConfigValueError
from diffaccel.contract.validators import in_range, one_of, positive
from diffaccel.kit.words import words

# Row r is seeded with seeds[r] + _SALT: the pipeline seeds its own generators with seeds[r], and
# sharing its stream would correlate our draws with its noise.
_SALT = 0x746F706B  # "topk"


@attrs.frozen(kw_only=True)
class TopKConfig:
    """Keys of ``[[strategy]] use = "topk"``."""

    k: int = attrs.field(default=5, validator=in_range(1, None))
    """Draw each token from its k most probable tokens (1 is the argmax; at most the vocabulary size)."""
    temperature: float = attrs.field(default=1.0, validator=positive)
    """Divides the top-k logits before they are renormalised: below 1 sharpens, above 1 flattens."""
    k_keep: int | None = attrs.field(default=128, validator=in_range(0, None))
    """Truncation: each position keeps its k_keep largest logits at every step, the rest become -inf. At least k; 0 (or None) keeps the whole vocabulary."""
    at_steps: bool = False
    """Masked sampler: also draw from the top-k whenever the sampler commits tokens at a step. Run the sampler at temperature 0, or it samples again from what it gets."""
    at_finalize: bool = True
    """Draw from the top-k at finalize wherever the default would take the argmax."""
    rank: str = attrs.field(default="model", validator=one_of(("model", "gumbel")))
    """With at_steps, what the masked sampler ranks positions by when it picks which to commit. model: the model's top-1 probability, the order of argmax decoding (the drawn token's logit is swapped with the top-1's). gumbel: the Gumbel-perturbed top-k scores, -inf elsewhere."""

    def __attrs_post_init__(self):
        if self.k_keep and self.k_keep < self.k:
            raise ConfigValueError("k_keep", f"must be at least k ({self.k}) so the top-k survive truncation, or 0 to keep "
                                             f"the whole vocabulary; got {self.k_keep}")


def gumbel(gens: Sequence[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gumbel noise (B, *shape); row r comes from ``gens[r]`` alone."""
    return torch.stack([torch.empty(shape).exponential_(generator=g) for g in gens]).log().neg()


def draw_topk(logits: torch.Tensor, k: int, temperature: float, gens: Sequence[torch.Generator]) -> torch.Tensor:
    """One token per position (B, N) from softmax(top-k logits / temperature); row r uses ``gens[r]``."""
    vals, idx = logits.topk(k, dim=-1)
    scores = vals.float() / temperature + gumbel(gens, vals.shape[1:]).to(vals.device)
    return idx.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)


def self_similarity(samples: Sequence[Any], n: int = 2) -> float:
    """Mean Jaccard overlap of the n-gram sets of every pair of samples (1: all alike, 0: disjoint).

    A sample is a text (split into words by ``diffaccel.kit.words``, as the text metrics do) or a sequence of token ids.
    """
    seqs = [words(s) if isinstance(s, str) else [int(t) for t in s] for s in samples]
    grams = [{tuple(s[i:i + n]) for i in range(len(s) - n + 1)} for s in seqs]
    pairs = [len(a & b) / len(a | b) for a, b in combinations(grams, 2) if a | b]
    return sum(pairs) / len(pairs) if pairs else 1.0


@attrs.define(eq=False)
class TopKState:
    """topk's state for one generation and guidance branch."""

    gens: list[torch.Generator]
    """One generator per batch row, seeded from the row's seed: draws do not depend on the batch."""
    values: torch.Tensor | None = None
    """The last step's kept logits and their token ids (B, N, k)."""
    indices: torch.Tensor | None = None
    steps: int = 0
    """Steps truncated."""
    steps_sampled: int = 0
    """Steps where tokens were drawn from the top k (at_steps)."""
    seconds: float = 0.0
    held: int = 0
    """Logit values held, summed over steps (held_bytes: their bytes, with the indices)."""
    held_bytes: int = 0
    full: int = 0
    """Logit values of the full vocabulary, summed over steps (full_bytes: their bytes)."""
    full_bytes: int = 0


class TopK:
    """Strategy instance; one per ``[[strategy]]`` table, reused across runs (state lives in the run)."""

    name = "topk"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: TopKConfig | None = None):
        self.config = config or TopKConfig()

    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        """Reject k and k_keep above the model's vocabulary (called by the core with adapter facts)."""
        vocab, c = info.get("vocab_size"), self.config
        if vocab is None:
            return
        if c.k > vocab:
            raise ConfigValueError("k", f"must be at most the vocabulary size ({vocab}), got {c.k}")
        if c.k_keep and c.k_keep > vocab:
            raise ConfigValueError("k_keep", f"must be at most the vocabulary size ({vocab}), got {c.k_keep}; 0 keeps the whole vocabulary")

    @hookimpl
    def diffaccel_new_state(self, run) -> "TopKState":
        seeds = run.info.seeds or range(run.batch_size)
        return TopKState(gens=[torch.Generator().manual_seed((int(s) + _SALT) % 2**63) for s in seeds])

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        self.diffaccel_setup(run.info.as_dict())  # instances passed to apply(strategies=...) never went through build_strategies
        run.state(self)  # the per-row generators start fresh with every run

    @hookimpl
    def diffaccel_denoiser_output(self, run, output: torch.Tensor) -> Any:
        c = self.config
        sample = c.at_steps and run.info.tokens.sampler == "masked"  # only the masked sampler commits tokens
        if not (c.k_keep or sample):
            return None
        t0 = time.perf_counter()
        st = run.state(self)
        vals, idx = output.topk(c.k_keep or c.k, dim=-1)  # largest first
        dense = bool(c.k_keep)
        if sample:
            scores = vals[..., :c.k].float() / c.temperature + gumbel(st.gens, vals.shape[1:-1] + (c.k,)).to(vals.device)
            if c.rank == "gumbel":
                # the sampler's argmax and its softmax confidence both follow the perturbed scores
                vals, idx, dense = scores.to(vals.dtype), idx[..., :c.k], True
            else:
                # swap the drawn token's logit with the top-1's: the argmax becomes the draw while
                # the distribution, hence the sampler's confidence, stays the model's
                j = scores.argmax(-1, keepdim=True)
                drawn, top = idx.gather(-1, j), idx[..., :1]
                idx = idx.scatter(-1, j, top).scatter(-1, torch.zeros_like(j), drawn)
            st.steps_sampled += 1
        # truncated: hand the sampler the k_keep (values, indices) themselves; it samples from them
        # without ever building the (B, N, V) tensor (-inf elsewhere) that a dense answer would be
        # the adapter's truncated-logits type (token-logits): values and indices, no dense tensor
        out = run.info.tokens.truncated_logits(vals, idx, output.shape[-1]) if dense else output.scatter(-1, idx, vals)
        st.values, st.indices = vals, idx
        st.steps += 1
        st.held += vals.numel()
        st.held_bytes += vals.numel() * vals.element_size() + idx.numel() * idx.element_size()
        st.full += output.numel()
        st.full_bytes += output.numel() * output.element_size()
        st.seconds += time.perf_counter() - t0
        return out

    @hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        c, st = self.config, run.state(self)
        drawn = 0
        if c.at_finalize and final.tokens is None:  # an earlier strategy's choice stands
            todo = ~final.fixed
            if run.info.tokens.sampler == "masked":
                # committed tokens stay: the model's outputs at unmasked inputs are not trained
                todo &= final.draft == final.mask_id
            if bool(todo.any()):
                mask = torch.tensor([final.mask_id], device=final.logits.device)
                tokens = draw_topk(final.logits.index_fill(-1, mask, -math.inf), c.k, c.temperature, st.gens)
                final.tokens = torch.where(todo, tokens, final.draft)
                drawn = int(todo.sum())
        steps = max(st.steps, 1)
        m: dict[str, Any] = {
            "k": c.k, "k_keep": c.k_keep or None, "temperature": c.temperature,
            "vocab_size": run.info.tokens.vocab_size, "steps_truncated": st.steps, "steps_sampled": st.steps_sampled,
            "finalize_drawn": drawn, "held_values_per_step": st.held // steps, "full_values_per_step": st.full // steps,
            "held_bytes_per_step": st.held_bytes // steps, "full_bytes_per_step": st.full_bytes // steps,
            "held_ratio": st.full_bytes / st.held_bytes if st.held_bytes else 1.0, "seconds": st.seconds,
        }
        tokens = final.tokens if final.tokens is not None else final.draft
        if tokens.shape[0] > 1:  # several samples in one batch: how alike they are
            m["self_similarity"] = self_similarity([row[~fx].tolist() for row, fx in zip(tokens.cpu(), final.fixed.cpu())])
        run.metrics[self.name] = m

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        st = run.state(self)
        st.values = st.indices = None

    @hookimpl
    def diffaccel_bench_quality(self, outputs: list[Any], seeds: list[int]) -> dict[str, float]:
        """``self_similarity`` of an entry's texts over all its seeds (1: all alike), on this
        strategy's entry and on the baseline's, beside the bench's distinct-n: what a top-k draw
        buys in variety (argmax decoding repeats itself across seeds)."""
        texts = [t for out in outputs for t in getattr(out, "texts", None) or []]
        return {"self_similarity": self_similarity(texts)} if len(texts) > 1 else {}
