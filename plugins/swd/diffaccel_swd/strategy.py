"""The ``swd`` strategy: stable window decoding for text diffusion LMs.

After each step, a position is *stable* when its top-1 token was the same for the last ``K``
steps and the mean probability of that token over those steps is at least ``tau``. The next
step computes only the unstable positions widened by ``R`` on each side (the text adapter's
partial computation); stable positions keep their last logits and serve their cached keys and
values. In the continuous samplers the stale logits of a stable position make the sampler's
DDIM update advance it in closed form from its last clean estimate (``stable_latents =
"advance"``), or its latent is frozen (``"hold"``).

Masked sampler specifics: a position whose input token changed (committed at the last step) is
unstable for the next step, since its cached keys and values still see ``[MASK]``; the whole
forward pass is reused (``exact_skip``) when no input token and no computed top-1 changed and
the model is not time-conditioned, which is then exact (MDLM's cache).

State is per run, per guidance branch (``run.state``), with a leading batch dimension: rows
never influence each other's decisions.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

from diffaccel import hookimpl
from diffaccel.contract.capabilities import TOKEN_LOGITS, TOKEN_POSITIONS
from diffaccel.contract.errors import ConfigError
from diffaccel.contract.state import StepPlan
from diffaccel.contract.validators import in_range, one_of
from diffaccel.kit.paygate import MODES, PayGate, describe

from .plot import stability_curve

#: Defaults chosen per sampler on the shipped models (see the README's sweeps). In the masked
#: sampler the masked positions that remain are, by construction, the unconfident ones (the
#: confident ones are committed first), so a high ``tau`` would only ever mark committed
#: positions; its default asks for an unchanged top-1 only (0.01 is below the top-1
#: probabilities seen there). Masked max_age 8: kept logits older than 8 steps are computed
#: again, which brings the samples' generative perplexity under a real LM (SmolLM2-135M) from
#: +16% to +3% of the baseline's at 19% of positions instead of 15% (README, tuning seeds).
DEFAULTS: dict[str, dict[str, Any]] = {
    "masked": {"tau": 0.01, "K": 2, "R": 1, "R_end": None, "max_age": 8},
    "continuous": {"tau": 0.5, "K": 3, "R": 1, "R_end": None, "max_age": 0},
}


@attrs.frozen(kw_only=True)
class SWDConfig:
    """Keys of ``[[strategy]] use = "swd"``."""

    tau: float | None = attrs.field(default=None, validator=in_range(0.0, 1.0, lo_open=True))
    """Stable needs the mean top-1 probability over the last K steps to be at least tau, in (0, 1]. Default per sampler: masked 0.01 (an unchanged top-1 is what counts), ddim/ddpm/hybrid 0.5."""
    K: int | None = attrs.field(default=None, validator=in_range(1, None))
    """Stable needs the same top-1 token for the last K steps (K >= 1). Default per sampler: masked 2, ddim/ddpm/hybrid 3."""
    R: int | None = attrs.field(default=None, validator=in_range(0, None))
    """Each unstable position is widened by R positions on both sides (clipped to the sequence), R >= 0. Default 1."""
    R_end: int | None = attrs.field(default=None, validator=in_range(0, None))
    """R at the last step; between the first and the last step R moves linearly from R to R_end (None: R throughout)."""
    stable_latents: str = attrs.field(default="advance", validator=one_of(("advance", "hold")))
    """Continuous samplers: what happens to the latent of a position not computed. advance: the sampler's update from its last clean estimate (closed form, no model call). hold: the latent is frozen."""
    exact_skip: bool = True
    """Reuse the whole last forward pass when no input token and no top-1 token changed in a step and the model is not time-conditioned (exact)."""
    early_stop: bool = True
    """End the generation once every position is stable (masked sampler: and nothing is left to commit); the report says at which step."""
    widen_committed: bool = False
    """Masked sampler: the R-widening around an unstable position also recomputes committed neighbours. false (default): only masked neighbours; a committed token is recomputed at the step after its commit (so its keys and values see it), and not again because a neighbour moved (its prediction is the token)."""
    max_age: int | None = attrs.field(default=None, validator=in_range(0, None))
    """A position whose logits are max_age steps old counts as unstable and is computed again (0: no limit). Masked sampler: committed tokens are exempt (their estimate is the token), except with fresh_commits, where they are context whose keys and values this refreshes. Default per sampler: masked 8, ddim/ddpm/hybrid 0."""
    fresh_commits: bool = True
    """Masked sampler: every masked position is computed at every step, so no token is ever committed from a prediction made before the last commit (stable positions are skipped as context only: committed and prompt positions keep their keys and values, refreshed the step after their commit and every max_age steps). false: a stable masked position keeps its last prediction, which the sampler may commit (the rule before 2026-12-07)."""
    cost_gate: str = attrs.field(default="auto", validator=one_of(MODES))
    """Whether partial steps pay on this model and batch: auto times 3 plain steps and 4 steps with swd at the first run (real steps) and runs full steps from then on where swd's steps are not faster; on: always swd; off: never (full steps). The verdict is kept for the instance's later runs of the same model, batch and length; the run summary says it in one line."""


def update_stability(run_len: torch.Tensor, probs: torch.Tensor, prev_top1: torch.Tensor, top1: torch.Tensor,
                     top1_prob: torch.Tensor, step: int, K: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the stability test, per position (B, N).

    ``run_len`` counts the consecutive steps with the same top-1 (updated in place); ``probs``
    (K, B, N) is a ring of the last K top-1 probabilities (written in place at ``step % K``).
    Returns (stable, top1_changed).
    """
    changed = top1 != prev_top1
    run_len.add_(1).masked_fill_(changed, 1)
    probs[step % K] = top1_prob
    # run_len >= K implies the ring holds K probabilities of this same token
    stable = (run_len >= K) & (probs.mean(0) >= tau)
    return stable, changed


def widen(unstable: torch.Tensor, R: int) -> torch.Tensor:
    """Positions within R of an unstable one (B, N) bool, clipped to the sequence."""
    if R == 0:
        return unstable.clone()
    x = unstable.float().unsqueeze(1)
    return F.max_pool1d(x, kernel_size=2 * R + 1, stride=1, padding=R).squeeze(1) > 0


def radius_at(step: int, num_steps: int, R: int, R_end: int | None) -> int:
    """R at ``step`` (0-based): constant, or linear from R at the first step to R_end at the last."""
    if R_end is None or num_steps <= 1:
        return R
    return round(R + (R_end - R) * step / (num_steps - 1))


NEEDS = (TOKEN_POSITIONS, TOKEN_LOGITS)
"""What swd needs of a model (its ``requires``)."""


@attrs.define(eq=False)
class SWDState:
    """swd's state for one generation and guidance branch (tensors (B, N) unless said)."""

    tau: float
    """Resolved for the run's sampler (``SWD.resolved``)."""
    K: int
    R: int
    R_end: int | None
    max_age: int
    run_len: torch.Tensor | None = None
    """Consecutive steps each position's top-1 has held."""
    probs: torch.Tensor | None = None
    """(K, B, N) the last K top-1 probabilities."""
    top1: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    """Masked sampler: the sequence after the last step."""
    latents: torch.Tensor | None = None
    """stable_latents = "hold": the latents after the last step."""
    next: torch.Tensor | None = None
    """The positions the next step computes; None before the first step (every position)."""
    age: torch.Tensor | None = None
    """Steps since each position was last computed."""
    reuse: bool = False
    """The next step may be reused whole (exact_skip)."""
    asked_reuse: bool = False
    first_stable: torch.Tensor | None = None
    """The step each position first counted as stable (-1: never)."""
    computed: list[float] = attrs.Factory(list)
    """Per step, the share of positions computed."""
    stable: list[float] = attrs.Factory(list)
    """Per step, the share of positions stable."""
    reused: int = 0
    stopped_at: int | None = None
    gate: Any = None
    """The run's cost gate (``diffaccel.kit.paygate.GateRun``)."""
    fresh: bool = False
    """fresh_commits, for the masked sampler."""


class SWD:
    """Strategy instance; one per ``[[strategy]]`` table, reused across runs (state lives in the run)."""

    name = "swd"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: SWDConfig | None = None):
        self.config = config or SWDConfig()
        self.paygate = PayGate(mode=self.config.cost_gate)

    def resolved(self, sampler: str) -> dict[str, Any]:
        """tau, K, R, R_end and max_age for a sampler: the config's values, else the sampler's defaults
        (R_end defaults only together with R: a config that sets R alone gets a constant R)."""
        d, c = DEFAULTS["masked" if sampler == "masked" else "continuous"], self.config
        out = {"tau": d["tau"] if c.tau is None else c.tau, "K": d["K"] if c.K is None else c.K}
        out["R"], out["R_end"] = (d["R"], d["R_end"] if c.R_end is None else c.R_end) if c.R is None else (c.R, c.R_end)
        out["max_age"] = d["max_age"] if c.max_age is None else c.max_age
        return out

    @hookimpl
    def diffaccel_new_state(self, run) -> SWDState:
        info = run.info.tokens
        sampler = info.sampler or "masked"
        # one gate per run and guidance branch; its verdict is the instance's, per model, batch and length
        gate = self.paygate.start((run.info.checkpoint, info.length, sampler, run.batch_size, run.num_steps))
        return SWDState(**self.resolved(sampler), gate=gate, fresh=self.config.fresh_commits and sampler == "masked")

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        # instances handed to apply(strategies=...) skip the config's capability check
        lacking = [c for c in NEEDS if c not in run.capabilities]
        if lacking:
            raise ConfigError(f"strategy 'swd' needs a model with capability '{lacking[0]}'")
        run.state(self)

    @hookimpl
    def diffaccel_pre_step(self, run) -> StepPlan | None:
        st = run.state(self)
        st.gate.tick(run.step)
        if not st.gate.active:
            st.next, st.top1 = None, None  # full steps; should it act again, it starts afresh
            return None
        if st.next is None:
            return StepPlan()  # first step: every position
        # positions too when reusing: if another strategy's plan does not reuse, the merge computes these
        st.asked_reuse = st.reuse
        return StepPlan(positions=st.next, reuse_step=st.reuse)

    @hookimpl
    def diffaccel_post_step(self, run, output) -> None:
        st, c = run.state(self), self.config
        if not st.gate.active:
            st.computed.append(1.0)
            st.stable.append(0.0)
            return
        top1, B, N = output.top1, *output.top1.shape
        masked_sampler = output.masked is not None
        computed = _computed_mask(output.computed, B, N, top1.device)
        if masked_sampler:
            # MDLM's carry-over: a committed position's estimate is its token, with certainty
            top1 = torch.where(output.masked, top1, output.tokens)
        if st.top1 is None:
            st.run_len = torch.zeros(B, N, dtype=torch.long, device=top1.device)
            st.probs = torch.zeros(st.K, B, N, device=top1.device)
            st.first_stable = torch.full((B, N), -1, dtype=torch.long, device=top1.device)
            st.age = torch.zeros(B, N, dtype=torch.long, device=top1.device)
            st.top1 = top1
        prob = output.top1_prob.float()
        if masked_sampler:
            prob = prob.masked_fill(~output.masked, 1.0)
        stable, top1_changed = update_stability(st.run_len, st.probs, st.top1, top1, prob,
                                                run.step, st.K, st.tau)
        st.top1 = top1.clone()
        if output.fixed is not None:
            stable |= output.fixed  # prompt / condition positions: never recomputed for their own sake
        input_changed = None
        if masked_sampler:
            # tokens committed at this step: their cached keys and values still see [MASK]
            if st.tokens is None:  # the first input was [MASK] wherever the sequence is not fixed
                input_changed = ~output.masked if output.fixed is None else ~output.masked & ~output.fixed
            else:
                input_changed = output.tokens != st.tokens
            # a committed token is certain (carry-over): stable once its cache has seen it, and
            # recomputed at the step right after its commit, never for the K-step test
            stable = torch.where(output.masked, stable, ~input_changed)
            st.tokens = output.tokens.clone()  # the sampler writes its sequence in place
        elif c.stable_latents == "hold" and getattr(output, "latents", None) is not None:
            self._hold(st, output, computed)
        if st.max_age:
            st.age = torch.where(computed, 0, st.age + 1)
            old = st.age >= st.max_age
            # fresh commits: committed and prompt positions are context, refreshed when old
            stable &= ~(old & output.masked) if masked_sampler and not st.fresh else ~old
        st.first_stable.masked_fill_(stable & (st.first_stable < 0), run.step)
        nxt = widen(~stable, radius_at(run.step + 1, run.num_steps, st.R, st.R_end))
        if masked_sampler and not c.widen_committed:
            nxt = (nxt & output.masked) | ~stable  # the widening reaches masked neighbours only
        if st.fresh:
            nxt = nxt | output.masked  # every prediction the sampler may commit is made at that step
        st.next = nxt
        st.reuse = bool(c.exact_skip and input_changed is not None and run.info.time_conditioned is False
                           and not input_changed.any() and not (top1_changed & computed).any())
        st.computed.append(float(computed.float().mean()))
        st.stable.append(float(stable.float().mean()))
        # an exact skip that took effect (a step whose window was empty computed nothing either,
        # but reused nothing on purpose)
        st.reused += int(st.asked_reuse and output.computed is not None and not bool(output.computed.any()))
        if c.early_stop and bool(stable.all()) and not (masked_sampler and bool(output.masked.any())):
            run.stop = True
            st.stopped_at = run.step

    def _hold(self, st: "SWDState", output, computed: torch.Tensor) -> None:
        """Freeze the latents of the positions not computed at this step (continuous samplers)."""
        z = output.latents
        if st.latents is not None:
            hold = ~computed
            if output.fixed is not None:
                hold &= ~output.fixed  # the sampler drives prompt latents itself
            z[hold] = st.latents[hold]
        st.latents = z.clone()

    @hookimpl
    def diffaccel_finalize(self, run, final) -> None:
        st = run.state(self)
        steps = len(st.computed)
        run.metrics[self.name] = {
            "tau": st.tau, "K": st.K, "R": st.R, "R_end": st.R_end, "max_age": st.max_age,
            "sampler": run.info.tokens.sampler,
            "computed_per_step": st.computed,
            "stable_per_step": st.stable,
            "mean_computed": sum(st.computed) / steps if steps else 1.0,
            "steps_reused": st.reused,
            "stopped_at": st.stopped_at,
            "first_stable_step": st.first_stable.tolist() if st.first_stable is not None else [],
            "fresh_commits": st.fresh,
        }
        verdict = st.gate.finish()
        run.metrics[self.name]["cost_gate"] = None if verdict is None else attrs.asdict(verdict)
        run.metrics[self.name]["summary"] = describe(self.name, self.config.cost_gate, verdict)

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        st = run.state(self)
        for key in ("run_len", "probs", "top1", "tokens", "latents", "next", "age"):
            setattr(st, key, None)

    @hookimpl
    def diffaccel_bench_plot(self, reports: list[dict[str, Any]], path) -> None:
        stability_curve(reports, path)


def _computed_mask(computed: torch.Tensor | None, B: int, N: int, device) -> torch.Tensor:
    """The positions computed at this step, (B, N) bool (``computed`` None: all)."""
    if computed is None:
        return torch.ones(B, N, dtype=torch.bool, device=device)
    return computed.to(device)
