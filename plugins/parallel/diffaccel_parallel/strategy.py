"""The ``parallel`` strategy: the masked sampler commits, at each step, every candidate a rule
finds confident enough, beside the one (or few) its schedule commits anyway. A run then ends as
soon as every position is committed: it needs fewer steps, not cheaper ones.

Rules (``rule``), each over a row's candidates (masked positions of its current block) taken in
confidence order, the schedule's own commits always kept (the core's merge rule):

* ``threshold``: every candidate whose confidence is at least ``tau`` (Fast-dLLM's threshold
  rule; at least one per row and step comes from the schedule).
* ``factor``: Fast-dLLM's factor rule: the largest n such that the k-th most confident has
  confidence >= 1 - factor / (k + 1) for every k <= n (NVlabs/Fast-dLLM, ``llada/generate.py``,
  ``get_transfer_index_dynamic``). More candidates may go when each is more certain.
* ``entropy``: the longest confidence-ordered prefix whose summed entropy, less its largest
  entry, stays at most ``gamma`` nats (the entropy bound of Ben-Hamu et al.'s EB-sampler). On
  the ``ratio`` scale each entropy is taken as its excess over the row's lowest candidate
  entropy at the step (a weak model's entropies are all several nats).

Confidence (``scale``): ``prob`` is the drawn token's probability, Fast-dLLM's measure. A small
model is rarely sure of anything (the shipped masked model's best still-masked top-1 has a
median of 0.11), so ``prob`` with LLaDA's tau = 0.9 never fires; ``ratio`` divides it by the
row's best candidate at that step, a scale the model sets itself: tau = 0.7 commits every
candidate at least 70% as sure as the surest one. The factor rule on ``ratio`` always lets the
first through (ratio 1) and then reads the others against the best.

``max_per_step`` caps a row's commits at a step (the schedule's count when it is higher).
``spacing`` keeps a step's extra commits apart: a candidate within ``spacing`` positions of one
committed at the same step (the schedule's, or a surer extra) waits for a later step. Tokens
drawn in one step are drawn independently of each other; neighbours depend on each other most,
so committing them together is where parallel decoding loses coherence (the dilated schedules of
DUS, Luxembourg et al. 2025, spread a step's commits for the same reason).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from diffaccel import hookimpl
from diffaccel.contract.errors import ConfigValueError
from diffaccel.contract.validators import in_range, non_negative, one_of, positive

RULES = ("threshold", "factor", "entropy")
SCALES = ("ratio", "prob")


@attrs.frozen(kw_only=True)
class ParallelConfig:
    """Keys of ``[[strategy]] use = "parallel"``."""

    rule: str = attrs.field(default="threshold", validator=one_of(RULES))
    """Which candidates a step commits beyond the schedule: threshold, factor or entropy (module docstring)."""
    scale: str = attrs.field(default="ratio", validator=one_of(SCALES))
    """Confidence the rules read: prob (the drawn token's probability) or ratio (that over the row's best candidate's at the step)."""
    tau: float = attrs.field(default=0.7, validator=in_range(0.0, 1.0, lo_open=True))
    """threshold rule: commit every candidate whose confidence is at least tau, in (0, 1]."""
    factor: float = attrs.field(default=1.0, validator=positive)
    """factor rule: f in 1 - f / (k + 1), the confidence the k-th most confident candidate needs."""
    gamma: float = attrs.field(default=1.0, validator=non_negative)
    """entropy rule: bound in nats on the committed candidates' summed entropy (ratio: excess over the row's lowest) less the largest."""
    max_per_step: int | None = attrs.field(default=None, validator=positive)
    """At most this many commits per row and step (the schedule's count when higher); None: no cap."""
    spacing: int = attrs.field(default=0, validator=non_negative)
    """Extra commits of a step stay more than this many positions from each other and from the schedule's (0: no constraint)."""


def scaled_confidence(confidence: torch.Tensor, candidates: torch.Tensor, scale: str) -> torch.Tensor:
    """(B, N) confidence on the rule's scale, -inf outside the candidates."""
    conf = confidence.float().masked_fill(~candidates, -math.inf)
    if scale == "ratio":
        best = conf.amax(1, keepdim=True)
        conf = conf / torch.where(best > 0, best, torch.ones_like(best))
    return conf


def entropies(logits: Any, rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy in nats of softmax(logits / T) at the flat (B * N) positions ``rows`` (T = 1 at
    temperature 0: the model's own distribution). Logits truncated to k per position (the
    ``token-logits`` capability's truncated form: ``values`` and ``indices``) give their kept
    values' entropy."""
    T = temperature if temperature > 0 else 1.0
    values = logits if isinstance(logits, torch.Tensor) else logits.values
    lg = values.reshape(-1, values.shape[-1]).index_select(0, rows)
    logp = (lg.float() / T).log_softmax(-1)
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)


def choose(conf: torch.Tensor, config: ParallelConfig, entropy: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N) bool: the candidates the rule commits, from ``conf`` (``scaled_confidence``: -inf
    outside the candidates) and, for the entropy rule, each position's ``entropy`` (B, N)."""
    c = config
    if c.rule == "threshold" and c.max_per_step is None:
        return conf >= c.tau
    vals, order = conf.sort(1, descending=True)
    valid = vals > -math.inf
    k = torch.arange(1, conf.shape[1] + 1, device=conf.device, dtype=conf.dtype)[None, :]
    if c.rule == "threshold":
        ok = vals >= c.tau
    elif c.rule == "factor":
        ok = vals >= 1.0 - c.factor / (k + 1.0)
        ok[:, 0] = True  # the surest one always goes (Fast-dLLM's threshold -1 for the first)
    else:
        h = entropy.float().gather(1, order).masked_fill(~valid, 0.0)
        if c.scale == "ratio":  # excess over the row's surest candidate: its own scale, 0 for the best
            h = (h - h.masked_fill(~valid, math.inf).amin(1, keepdim=True)).masked_fill(~valid, 0.0)
        ok = h.cumsum(1) - h.cummax(1).values <= c.gamma
    ok = ok & valid
    if c.rule != "threshold":
        ok = ok.long().cumprod(1).bool()  # a prefix in confidence order
    if c.max_per_step is not None:
        ok[:, c.max_per_step:] = False
    return torch.zeros_like(ok).scatter_(1, order, ok)


def _near(mask: torch.Tensor, spacing: int) -> torch.Tensor:
    """(B, N) bool: the positions within ``spacing`` of a True of ``mask`` (itself included)."""
    return torch.nn.functional.max_pool1d(mask.float()[:, None], 2 * spacing + 1, 1, spacing)[:, 0].bool()


def spaced(chosen: torch.Tensor, scheduled: torch.Tensor, conf: torch.Tensor, spacing: int) -> torch.Tensor:
    """``chosen`` (B, N) less every extra commit within ``spacing`` positions of the schedule's
    commits or of a surer extra one: greedy in confidence order, rows independent.

    Without a loop over the candidates: each round takes every open candidate that is the surest
    open one within ``spacing`` of itself, then closes their neighbourhoods. A candidate taken so
    has no surer open rival in reach, so the greedy pass in confidence order takes it too (the
    standard parallel form of the greedy independent set); a few rounds cover a step."""
    if spacing <= 0:
        return chosen
    N = chosen.shape[1]
    extra = chosen & ~scheduled
    # each extra's rank in confidence order as a unique priority (ties broken as the sort breaks them)
    order = conf.masked_fill(~extra, -math.inf).argsort(1, descending=True)
    prio = torch.empty_like(conf, dtype=torch.float32).scatter_(
        1, order, torch.arange(N, 0, -1, device=conf.device, dtype=torch.float32).expand_as(order).contiguous())
    kept = scheduled.clone()
    open_ = extra & ~_near(scheduled, spacing)
    while bool(open_.any()):
        p = prio.masked_fill(~open_, -1.0)
        take = open_ & (p == torch.nn.functional.max_pool1d(p[:, None], 2 * spacing + 1, 1, spacing)[:, 0])
        kept |= take
        open_ &= ~_near(take, spacing)
    return kept


class Parallel:
    """Strategy instance; one per ``[[strategy]]`` table, reused across runs (state lives in the run)."""

    name = "parallel"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: ParallelConfig | None = None):
        self.config = config or ParallelConfig()

    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        """Reject models without a masked sampler (called by the core with adapter facts)."""
        kind = info.get("kind")
        if kind is not None and kind != "masked":
            raise ConfigValueError("use", f"parallel chooses the commits of the masked sampler; this model is {kind} "
                                          "(ddim, ddpm and hybrid samplers commit nothing); use it with a masked model")

    @hookimpl
    def diffaccel_new_state(self, run) -> dict[str, Any]:
        return {"H": None, "H_valid": None, "extra": 0, "commits": 0, "steps": 0}

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        self.diffaccel_setup(run.info.as_dict())  # instances passed to apply(strategies=...) never went through build_strategies
        if (run.info.tokens.sampler or "masked") != "masked":
            raise ConfigValueError("use", f"parallel needs the masked sampler, not {run.info.tokens.sampler}")
        run.state(self)

    def _entropy(self, st: dict[str, Any], p) -> torch.Tensor:
        """Entropy at every candidate; positions whose logits the step did not recompute keep theirs."""
        B, N = p.candidates.shape
        if st["H"] is None:
            st["H"] = torch.zeros(B, N, device=p.candidates.device)
            st["H_valid"] = torch.zeros(B, N, dtype=torch.bool, device=p.candidates.device)
        if p.computed is None:
            st["H_valid"].zero_()
        else:
            st["H_valid"] &= ~p.computed
        stale = p.candidates & ~st["H_valid"]
        if bool(stale.any()):
            rows = stale.view(-1).nonzero().squeeze(1)
            st["H"].view(-1).index_copy_(0, rows, entropies(p.logits, rows, p.temperature))
            st["H_valid"] |= stale
        return st["H"]

    @hookimpl
    def diffaccel_commit(self, run, proposal) -> torch.Tensor:
        c, st = self.config, run.state(self)
        conf = scaled_confidence(proposal.confidence, proposal.candidates, c.scale)
        entropy = self._entropy(st, proposal) if c.rule == "entropy" else None
        chosen = choose(conf, c, entropy) & proposal.candidates
        if c.spacing:
            chosen = spaced(chosen, proposal.scheduled & proposal.candidates, conf, c.spacing)
        st["extra"] += int((chosen & ~proposal.scheduled).sum())
        st["commits"] += int((chosen | proposal.scheduled).sum())
        st["steps"] += 1
        return chosen

    @hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        c, st = self.config, run.state(self)
        steps = max(st["steps"], 1)
        run.metrics[self.name] = {
            "rule": c.rule, "scale": c.scale, "steps_run": st["steps"], "steps_configured": run.num_steps,
            "commits_per_step": st["commits"] / steps / run.batch_size,
            "extra_commits": st["extra"],
        }

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        st = run.state(self)
        st["H"] = st["H_valid"] = None
