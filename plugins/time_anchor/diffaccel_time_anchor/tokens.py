"""time-anchor's policy for models with ``token-positions``: anchored (layer, position) states
are left out of the layer's computation.

Anchored positions keep the adapter's in-place outputs and serve keys/values from its cache
(``layer.compute(hidden, positions=...)``). A position whose input changed (its token was
committed at the last step, within ``neighbors`` positions of one, or the layer below recomputed
it and found it moved) is recomputed even when anchored, so a new token climbs the layers at once
instead of waiting ``max_age`` steps. With ``mask-confidences`` (the masked sampler),
``pre_step`` also narrows the whole step (``StepPlan.positions``) to the positions some layer must
compute: the others are not embedded, and their logits are kept. Another strategy's positions OR
into that plan (the core's merge rule); each layer then computes the plan's positions that are
not anchored in it.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from diffaccel import StepPlan
from diffaccel.contract.capabilities import MASK_CONFIDENCES
from diffaccel.contract.errors import ConfigValueError
from diffaccel.kit.paygate import PayGate, describe

from .cache import LatentCache
from .state import AnchorState, rel_change


@attrs.define(eq=False)
class TokenState(AnchorState):
    """The token policy's state for one generation and guidance branch."""

    ranks: torch.Tensor | None = None
    """Rank of each position inside its cluster: where its reference state sits in the entry."""
    all_valid: bool = False
    """Every position has a key (stride 1, no clusters)."""
    dirty: torch.Tensor | None = None
    """(B, N) positions the layer below moved this step."""
    h0_ref: torch.Tensor | None = None
    """Continuous samplers: the input embeddings at the last step."""
    input_moved: torch.Tensor | None = None
    """(B, N) positions whose input embedding moved."""
    tokens: torch.Tensor | None = None
    """Masked sampler: the sequence after the last step."""
    token_moved: torch.Tensor | None = None
    """Positions committed at the last step, widened."""
    live: torch.Tensor | None = None
    """(L, B, N) entries that may be served at this step."""
    planned: Any = 0.0
    """Sum over narrowed steps of the share of positions planned."""
    planned_steps: int = 0
    served: list[tuple[int, torch.Tensor]] = attrs.Factory(list)
    """This step's (layer, served mask), counted at its last layer."""
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = attrs.Factory(list)
    """This step's cache writes."""
    pending_step: int = -1
    """The step they belong to."""
    gate: Any = None
    """The run's cost gate (``diffaccel.kit.paygate.GateRun``)."""
    prompt: torch.Tensor | None = None
    """With ``prompt_interval``: (B, N) the prompt's positions (the sampler's fixed ones)."""
    ages: torch.Tensor | None = None
    """With ``prompt_interval``: (B, N) how long each position's entry is served."""
    last_refresh: int = -1
    """With ``response_test = false``: the step that last computed the prompt."""


class TokenPolicy:
    """The token-position half of time-anchor; shares the strategy's config, gate and clusters."""

    def __init__(self, config, gate, clusters):
        self.config, self.gate, self.clusters = config, gate, clusters
        self.paygate = PayGate(mode=config.cost_gate)

    def new_state(self) -> TokenState:
        return TokenState()

    def run_start(self, run) -> None:
        if self.clusters is not None:
            n, have = (run.info.tokens.length or 0), len(self.clusters["assign"])
            if n > have:
                raise ConfigValueError("clusters", f"the file assigns {have} positions but the run generates {n}")
        info = run.info.tokens
        self._gate_key = (run.info.checkpoint, info.length, info.sampler, run.batch_size, run.num_steps)

    def gate_of(self, st: TokenState) -> Any:
        """The run's cost gate, made at the branch's first step (a state per guidance branch)."""
        if st.gate is None:
            st.gate = self.paygate.start(self._gate_key)
        return st.gate

    def post_step(self, st: TokenState, run, output) -> None:
        if output.masked is None or not self.gate_of(st).active:
            return
        tokens = output.tokens
        if self.config.prompt_interval and st.prompt is None and output.fixed is not None:
            st.prompt = output.fixed.clone()
            st.ages = torch.where(st.prompt, self.config.prompt_interval, self.config.max_age)
        if st.tokens is not None:
            st.token_moved = self._widen(tokens != st.tokens)
        else:  # the first input was [MASK] wherever the sequence is not fixed
            moved = ~output.masked if output.fixed is None else ~output.masked & ~output.fixed
            st.token_moved = self._widen(moved)
        st.tokens = tokens.clone()  # the sampler edits its sequence in place

    def finish(self, st: TokenState) -> None:
        self._end_step(st)

    def gate_metrics(self, m: dict[str, Any], states: list[TokenState]) -> dict[str, Any]:
        """The cost gate's verdict (``cost_gate``) and its line for the run summary (``summary``)."""
        verdicts = [s.gate.finish() for s in states if s.gate is not None]
        verdict = verdicts[0] if verdicts else None
        m["cost_gate"] = None if verdict is None else attrs.asdict(verdict)
        m["summary"] = describe("time-anchor", self.config.cost_gate, verdict)
        return m

    def add_metrics(self, m: dict[str, Any], states: list[TokenState], run) -> None:
        self.gate_metrics(m, states)
        planned = sum(s.planned_steps for s in states)
        # share of positions the narrowed steps embedded and ran in some layer (after warm-up)
        m["step_positions"] = round(float(sum(s.planned for s in states)) / planned, 4) if planned else 1.0

    def _init(self, st: TokenState, run, hidden: torch.Tensor) -> None:
        cfg = self.config
        B, N, D = hidden.shape
        L = run.info.n_layers
        dev = hidden.device
        pos = torch.arange(N, device=dev)
        if self.clusters is not None:
            slot = torch.tensor(self.clusters["assign"][:N], dtype=torch.long, device=dev)
            S = self.clusters["n_clusters"]
            # rank of each position inside its cluster: where its reference state sits in the entry
            same = slot[:, None] == slot[None, :]
            rank = (same & (pos[None, :] < pos[:, None])).sum(1)
            P = int(rank.max()) + 1
        else:
            S = math.ceil(N / cfg.stride)
            slot = torch.where(pos % cfg.stride == 0, pos // cfg.stride, torch.full_like(pos, -1))
            rank = torch.zeros_like(pos)
            P = 1
        rows = torch.arange(B, device=dev)[:, None]
        st.keys = torch.stack([torch.where(slot >= 0, (rows * L + i) * S + slot, -1) for i in range(L)])  # (L, B, N)
        st.ranks = rank
        st.all_valid = bool((slot >= 0).all())
        st.cache = LatentCache(B * L * S, D, P, max_entries=cfg.max_entries, max_bytes=cfg.max_bytes,
                               max_age=cfg.max_age, fp16=cfg.fp16, device=dev, dtype=hidden.dtype)
        st.anchored = torch.zeros(L, run.num_steps, device=dev)
        if self.gate is not None:
            st.gate_open = (self.gate.probs(run.num_steps) > cfg.gate_threshold).to(dev)

    def _widen(self, moved: torch.Tensor) -> torch.Tensor:
        """Add the ``neighbors`` positions on each side of every True position (B, N)."""
        r = self.config.neighbors
        if not r:
            return moved
        return torch.nn.functional.max_pool1d(moved[:, None].float(), 2 * r + 1, stride=1, padding=r)[:, 0] > 0

    def pre_step(self, st: TokenState, run):
        """Which entries may be served at this step, for every layer at once; with the masked
        sampler, the step is narrowed to the positions some layer must compute (the others are
        anchored at every layer: not embedded, not run, their logits kept)."""
        st.live = None
        self._end_step(st)  # what a step whose last layer another strategy answered left
        gate = self.gate_of(st)
        # its own steps start once the warm-up is over and one step has written references
        gate.tick(run.step, lambda first: run.step > max(first, self.config.warmup))
        if not self.config.response_test and gate.active and run.step >= self.config.warmup:
            return self._prompt_plan(st, run)
        if not gate.active or st.cache is None or run.step < self.config.warmup:
            return None
        live = st.cache.live(st.keys, run.step, st.ages)  # (L, B, N)
        if st.token_moved is not None:
            live &= ~st.token_moved
        st.live = live
        if MASK_CONFIDENCES not in run.capabilities or not self.config.narrow_step:
            return None  # continuous inputs move at every position: layer 0 tests them itself
        need = (~live).any(0)
        st.planned += need.float().mean()
        st.planned_steps += 1
        return StepPlan(positions=need)

    def _prompt_plan(self, st: TokenState, run):
        """``response_test = false``: every ``prompt_interval + 1``-th step runs whole (the
        prompt's keys and values renewed in the adapter's cache); the others run the response."""
        if st.prompt is None or MASK_CONFIDENCES not in run.capabilities:
            return None
        st.planned_steps += 1
        if st.last_refresh < 0 and run.step > 0:
            st.last_refresh = run.step - 1  # the step before ran whole: a warm-up step or a plain one of the cost gate
        if st.last_refresh < 0 or run.step - st.last_refresh > self.config.prompt_interval:
            st.last_refresh = run.step
            st.planned += 1.0
            return None
        need = ~st.prompt
        st.planned += need.float().mean()
        st.hits += st.prompt.sum() * run.info.n_layers
        st.lookups += st.prompt.numel() * run.info.n_layers
        return StepPlan(positions=need)

    def plan_metrics(self, states: list[TokenState]) -> dict[str, Any]:
        """The metrics of runs without a cache (``response_test = false``, or the cost gate kept
        time-anchor aside: nothing served, every position planned): served share, positions
        planned, the gate's verdict."""
        hits, lookups = sum(int(s.hits) for s in states), sum(int(s.lookups) for s in states)
        planned = sum(s.planned_steps for s in states)
        m = {"hit_rate": hits / lookups if lookups else 0.0, "hits": hits,
             "step_positions": round(float(sum(s.planned for s in states)) / planned, 4) if planned else 1.0}
        return self.gate_metrics(m, states)

    def layer_output(self, st: TokenState, run, layer, hidden: torch.Tensor) -> torch.Tensor:
        if not self.gate_of(st).active or not self.config.response_test:
            return layer.compute(hidden)  # a plain step, or the step's plan alone: none of the bookkeeping
        if st.cache is None:
            self._init(st, run, hidden)
        i, step = layer.index, run.step
        step_sel = layer.step_positions  # None: every position
        if i == 0:
            st.dirty = st.input_moved = self._input_moved(st, run, hidden)
        computed = step_sel
        if st.live is not None and layer.cached_output is not None:
            live = st.live[i]
            if st.dirty is not None:
                live &= ~st.dirty
            st.served.append((i, live))
            # served within the step's positions: outside them nothing runs anyway (the prompt
            # between its refreshes), and a layer that serves none of them runs the step's set
            inside = live if step_sel is None else live & step_sel.mask()
            if bool(inside.any()):
                computed = layer.select(~live if step_sel is None else step_sel.mask() & ~live)
                out = layer.compute(hidden, positions=computed)
            else:  # nothing to serve: the plain path, exactly the default's
                out = layer.compute(hidden)
        else:
            out = layer.compute(hidden)  # the adapter narrows it to the step's positions itself
        self._record(st, i, step, out, computed)
        st.pending_step = step
        if i == run.info.n_layers - 1:
            self._end_step(st)
        return out

    def _end_step(self, st: TokenState) -> None:
        """After the last layer (or, if another strategy answered for it, at the next step's
        plan and at the end of the run): the step's statistics and cache writes, each in one go
        (per layer they were a fifth of the strategy's cost). Writes can wait: a layer reads only
        its own keys."""
        step = st.pending_step
        if st.served:
            layers = torch.tensor([i for i, _ in st.served], device=st.anchored.device)
            served = torch.stack([m for _, m in st.served])
            st.anchored[layers, step] = served.flatten(1).float().mean(1)
            st.hits += served.sum()
            st.lookups += served.numel()
            st.served.clear()
        if st.pending:
            keys, anchored, values = (torch.cat(t) for t in zip(*st.pending))
            st.pending.clear()
            if keys.numel():
                st.cache.put(keys, step, anchored, values)

    def _input_moved(self, st: TokenState, run, h0: torch.Tensor) -> torch.Tensor | None:
        """Positions whose input embedding moved by more than the threshold since the last step.
        With the masked sampler an input moves exactly where a token was committed, which
        ``post_step`` recorded already: no comparison of the embeddings is needed."""
        if MASK_CONFIDENCES in run.capabilities:
            return st.token_moved
        prev, st.h0_ref = st.h0_ref, h0.clone()
        if prev is None:
            return None
        return self._widen(rel_change(h0, prev) >= self.config.threshold)

    def _record(self, st: TokenState, i: int, step: int, out: torch.Tensor, computed: Any) -> None:
        """Compare the computed states (``computed``, None: all) with their references, write
        the entries, mark movers."""
        cache = st.cache
        B, N, D = out.shape
        single = self.clusters is None  # one state per key: every rank is 0
        if computed is None:
            new, keys, ranks = out.reshape(B * N, D), st.keys[i].reshape(-1), 0 if single else st.ranks.repeat(B)
            flat = None
        else:
            flat = computed.flat
            new, keys = computed.gather(out), st.keys[i].reshape(-1).index_select(0, flat)
            ranks = 0 if single else st.ranks.index_select(0, computed.pos)
        ref, has = cache.read(keys, ranks)
        ref = ref.to(new.dtype)  # a float16 cache, read back in the model's dtype
        age = cache.age(keys, step).clamp(min=1)
        # in the model's dtype, summed in float32: no float32 copy of the states (bfloat16 models)
        d2 = (new - ref).square_().sum(-1, dtype=torch.float32)
        r2 = ref.square().sum(-1, dtype=torch.float32).clamp_(min=1e-12)
        # per-position change: positions that moved make the layer above recompute them
        moved = ~has | (torch.sqrt(d2 / r2) / age >= self.config.threshold)
        dirty = moved.view(B, N) if flat is None else torch.zeros(B * N, dtype=torch.bool, device=out.device).index_put_((flat,), moved).view(B, N)
        # what the next layer must recompute: what moved here, and every position whose input
        # token moved this step (a committed token is seen by every layer at once)
        st.dirty = dirty if st.input_moved is None else dirty | st.input_moved
        if self.clusters is None:
            # one position per key: the per-position test is the key's test
            held = ~moved
            if st.prompt is not None:  # the prompt is anchored whenever computed: its refresh is by age alone
                held |= st.prompt.reshape(-1) if flat is None else st.prompt.reshape(-1).index_select(0, flat)
            if st.all_valid:
                u, v, anchored = keys, new, held
            else:
                valid = keys >= 0
                u, v, anchored = keys[valid], new[valid], held[valid]
            if st.gate_open is not None:
                anchored = st.gate_open[i, step].expand(u.numel())
            st.pending.append((u, anchored, v))
            return
        valid = keys >= 0
        u, anchored = self._cluster_test(st, i, step, keys[valid], d2[valid], r2[valid], has[valid])
        if u.numel():
            cache.write(u, step, anchored)
            cache.store(keys, new, ranks)

    def _cluster_test(self, st: TokenState, i: int, step: int, flat, d2, r2, has):
        """A cluster key aggregates its computed positions: the relative change of the group."""
        cache, dev = st.cache, flat.device
        K = cache.n_keys
        touched = torch.zeros(K, dtype=torch.bool, device=dev)
        touched[flat] = True
        u = touched.nonzero().squeeze(1)
        if st.gate_open is not None:
            return u, st.gate_open[i, step].expand(u.numel())
        D2 = torch.zeros(K, device=dev).index_add_(0, flat, d2)
        R2 = torch.zeros(K, device=dev).index_add_(0, flat, r2)
        miss = torch.zeros(K, device=dev).index_add_(0, flat, (~has).float())
        rate = torch.sqrt(D2[u] / R2[u]) / cache.age(u, step).clamp(min=1)
        return u, (miss[u] == 0) & (rate < self.config.threshold)
