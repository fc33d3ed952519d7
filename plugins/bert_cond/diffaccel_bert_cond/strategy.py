"""The ``bert-cond`` strategy: two-stage BERT conditioning of text diffusion.

* Stage one (``run_start``): the encoder extracts each batch row's source into a ``Condition``
  (key terms, scores, pooled vector); timed, so the run reports its share.
* Stage two: models with condition gating (``cond_dim`` > 0) get the pooled vector through
  ``RunState.condition``: at every step, or (``vector_until = "placed"``) each row's until its
  terms are placed, then that row's vector is zeroed (the model adds no projection for a zero
  vector) and the rest is written unconditioned. ``pin`` says how the terms' tokens are enforced besides:
  ``even`` plans them over the generated positions (``plan.py``) and pins them through
  ``RunState.pinned`` (the adapter holds them fixed like prompt tokens); ``model`` places each
  during the run where the model expects it (``place.py``) and forces its tokens through the
  logits; ``none`` leaves the terms to the condition vector. With ``word_boundary``, the position
  right after each placed term may not take a token that would glue onto it.
* After the run (a ``finalize`` wrapper, so it sees the tokens the run returns), it reports the
  terms, which of them appear in the output, key-term recall and the stage-one time share.
"""

from __future__ import annotations

import math
import time
from typing import Any

import attrs
import torch

from diffaccel import hookimpl
from diffaccel.contract.capabilities import PINNED_TOKENS, TOKEN_LOGITS
from diffaccel.contract.errors import ConfigError, ConfigValueError
from diffaccel.kit.hygiene import deliberate

from .candidates import candidates
from .config import BertCondConfig
from .extract import Condition, Encoder, extract
from .metrics import presence, recall
from .place import RowPlacer, force
from .plan import TermsDoNotFit, pin_row, term_token_ids, word_continuations


def guard_word_ends(output: Any, where: tuple[torch.Tensor, torch.Tensor], cont: torch.Tensor) -> Any:
    """Logits with word-continuing tokens (``cont``, (V,) bool) set to -inf at positions ``where``
    (rows, cols), unless that would leave a position nothing to choose. ``output`` is dense
    (B, N, V) or truncated to k per position (an object with ``values`` and ``indices``, as the
    topk strategy hands on); it is not modified: the adapter keeps the raw logits in its cache."""
    rows, cols = where
    if isinstance(output, torch.Tensor):
        sub = output[rows, cols]  # advanced indexing copies
        banned = cont.to(output.device).expand_as(sub)
        values = output
    else:
        sub = output.values[rows, cols]
        banned = cont.to(sub.device)[output.indices[rows, cols]]
        values = output.values
    guarded = sub.masked_fill(banned, -math.inf)
    ok = torch.isfinite(guarded).any(-1, keepdim=True)
    new = values.index_put((rows, cols), torch.where(ok, guarded, sub))
    return new if isinstance(output, torch.Tensor) else attrs.evolve(output, values=new)


NEEDS = (TOKEN_LOGITS, PINNED_TOKENS)
"""What bert-cond needs of a model (its ``requires``)."""


@attrs.define(eq=False)
class BertCondState:
    """bert-cond's state for one generation and guidance branch."""

    t0: float
    """When the run started (perf_counter)."""
    conditions: list[Any] = attrs.Factory(list)
    """Per row, the ``Condition`` (key terms) extracted from its source."""
    rows: list[int] = attrs.Factory(list)
    """Per row, the index of its source."""
    after: Any = None
    """(rows, positions) right after a pinned term, where the word-end guard acts; None: nowhere."""
    cont: torch.Tensor | None = None
    """Token ids that continue a word (the guard bans them after a complete term)."""
    stage_one_s: float = 0.0
    plan_s: float = 0.0
    guard_s: float = 0.0
    pinned: int = 0
    """Positions pinned over the batch."""
    pin_mask: torch.Tensor | None = None
    pin_computed: int = 0
    free_computed: int = 0
    steps_seen: int = 0
    placers: list[RowPlacer] | None = None
    """pin = 'model': per row, where its terms went."""
    reserved: torch.Tensor | None = None
    """pin = 'model': (B, N) positions of placed terms."""
    forced: torch.Tensor | None = None
    """pin = 'model': (B, N) token each placed position must take, -1 elsewhere."""
    place_s: float = 0.0
    masked: torch.Tensor | None = None
    """pin = 'model': (B, N) positions masked at the start of the current step."""
    vector_steps: list[int] = attrs.Factory(list)
    """Per row, the steps its condition vector drove the model."""


class BertCond:
    """Strategy instance; one per ``[[strategy]]`` table. The encoder, loaded once, is kept here
    (a resource like the config); everything about a run lives in the run's state."""

    name = "bert-cond"  # the core overwrites it from the config; set here for instances built by hand

    def __init__(self, config: BertCondConfig):
        self.config = config
        self.sources = config.sources()
        self._encoder: Encoder | None = None
        self.load_seconds = 0.0
        self._continuations: tuple[Any, torch.Tensor] | None = None
        self._bench_terms: dict[str, tuple[str, ...]] = {}

    # -- set-up ------------------------------------------------------------------------------
    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            t0 = time.perf_counter()
            self._encoder = Encoder(self.config.bert, self.config.pooling)
            self.load_seconds = time.perf_counter() - t0
        return self._encoder

    @hookimpl
    def diffaccel_setup(self, info: dict[str, Any]) -> None:
        """Check the model's capabilities, load the encoder, check its size against the model's
        condition gating and that every source has candidate terms (called with the adapter's facts)."""
        lacking = [c for c in NEEDS if c not in info.get("capabilities", NEEDS)]
        if lacking:
            raise ConfigValueError("use", f"bert-cond pins tokens of a text diffusion model; this model lacks capability '{lacking[0]}'")
        cond_dim = info.get("cond_dim") or 0
        if self.config.pin == "none" and not (cond_dim and self.config.vector):
            why = "vector = false" if cond_dim else "this checkpoint has no condition gating (cond_dim 0)"
            raise ConfigValueError("pin", f'pin = "none" enforces the key terms through the condition vector only, but {why}: '
                                          f'nothing would enforce them; use pin = "even" or "model", or a checkpoint with condition gating (wordnet-masked-cond)')
        if self.config.pin == "model" and info.get("kind", "masked") != "masked":
            raise ConfigValueError("pin", f'pin = "model" places terms at masked positions; this is a {info.get("kind")} model; use pin = "even"')
        enc = self.encoder
        if self.config.vector and cond_dim and cond_dim != enc.hidden_size:
            raise ConfigValueError("bert", f"its hidden size {enc.hidden_size} differs from the text model's condition size "
                                           f"(cond_dim {cond_dim}); use an encoder of that size, or vector = false")
        key = "source" if self.config.source is not None else "source_file"
        for i, src in enumerate(self.sources):
            if not candidates(src, self.config.ngram_max):
                raise ConfigValueError(key, f"source #{i + 1} has no candidate key term (only stop words and punctuation): {src[:60]!r}")

    def _continuation_ids(self, tokenizer: Any, vocab_size: int) -> torch.Tensor:
        if self._continuations is None or self._continuations[0] is not tokenizer:
            self._continuations = (tokenizer, word_continuations(tokenizer, vocab_size))
        return self._continuations[1]

    def source_index(self, seed: int) -> int:
        return int(seed) % len(self.sources)

    def condition_of(self, source: str) -> Condition:
        c = self.config
        return extract(source, self.encoder, max_terms=c.max_terms, ngram_max=c.ngram_max,
                       diversity=c.diversity, always_keep=c.always_keep)

    def _fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"[[strategy]] ({self.name}): key '{key}': {message}")

    # -- the run -----------------------------------------------------------------------------
    @hookimpl
    def diffaccel_new_state(self, run) -> "BertCondState":
        return BertCondState(t0=time.perf_counter())

    @hookimpl
    def diffaccel_run_start(self, run) -> None:
        lacking = [c for c in NEEDS if c not in run.capabilities]
        if lacking:
            raise ConfigError(f"[[strategy]] ({self.name}): bert-cond pins tokens of a text diffusion model; "
                              f"this model lacks capability '{lacking[0]}'")
        self.encoder  # loaded before the clock starts: loading is not part of a run
        st = run.state(self)
        st.t0 = t0 = time.perf_counter()
        seeds = run.info.seeds or list(range(run.batch_size))
        rows = [self.source_index(s) for s in seeds]
        by_source: dict[int, Condition] = {}
        for i in rows:
            if i not in by_source:
                try:
                    by_source[i] = self.condition_of(self.sources[i])
                except ValueError as exc:
                    raise self._fail("source" if self.config.source is not None else "source_file", f"source #{i + 1} {exc}") from None
        st.conditions = conds = [by_source[i] for i in rows]
        st.rows = rows
        st.stage_one_s = time.perf_counter() - t0

        t1 = time.perf_counter()
        length, tok = run.info.tokens.length, run.info.tokens.tokenizer
        prompt_lengths = run.info.tokens.prompt_lengths or [0] * run.batch_size
        st.vector_steps = [0] * run.batch_size
        if self.config.vector and run.info.tokens.cond_dim:
            run.condition = torch.stack([c.vector for c in conds])
        if self.config.pin != "even":
            if self.config.pin == "model":
                self._start_placing(run, st, [term_token_ids(c.terms, tok) for c in conds], prompt_lengths, length)
            st.plan_s = time.perf_counter() - t1
            return
        pinned, after = [], []
        for r, cond in enumerate(conds):
            try:
                p, a, _ = pin_row(term_token_ids(cond.terms, tok), prompt_lengths[r], length)
            except TermsDoNotFit as exc:
                raise self._fail("max_terms", f"the {len(cond.terms)} key term{'s' if len(cond.terms) > 1 else ''} of source #{rows[r] + 1} take {exc.needed} tokens but "
                                              f"only {exc.free} positions are free (length {length}, prompt {prompt_lengths[r]}); "
                                              f"lower max_terms or raise [model] length") from None
            pinned.append(p)
            after.append(a)
        run.pinned = torch.stack(pinned)
        st.pinned = int((run.pinned >= 0).sum())
        if self.config.word_boundary and any(bool(a.any()) for a in after):
            after = torch.stack(after)
            st.after = after.nonzero(as_tuple=True)
            st.cont = self._continuation_ids(tok, run.info.tokens.vocab_size)
        st.plan_s = time.perf_counter() - t1

    def _start_placing(self, run, st: "BertCondState", term_ids: list[list[list[int]]], prompt_lengths, length: int) -> None:
        for r, ids in enumerate(term_ids):
            needed, free = sum(len(i) for i in ids), length - prompt_lengths[r]
            if needed > free:
                raise self._fail("max_terms", f"the {len(ids)} key term{'s' if len(ids) > 1 else ''} of source #{st.rows[r] + 1} take {needed} tokens but "
                                              f"only {free} positions are free (length {length}, prompt {prompt_lengths[r]}); "
                                              f"lower max_terms or raise [model] length")
        st.placers = [RowPlacer(ids) for ids in term_ids]
        st.reserved = torch.zeros(run.batch_size, length, dtype=torch.bool)
        st.forced = torch.full((run.batch_size, length), -1, dtype=torch.long)
        st.masked = torch.ones(run.batch_size, length, dtype=torch.bool)
        for r, n in enumerate(prompt_lengths):
            st.masked[r, :n] = False
        if self.config.word_boundary:
            st.cont = self._continuation_ids(run.info.tokens.tokenizer, run.info.tokens.vocab_size)

    @hookimpl
    def diffaccel_denoiser_output(self, run, output: Any) -> Any:
        st = run.state(self)
        if st.placers is not None:
            # the placers are Python, one row at a time, on that row's log-probabilities: on the host by design
            with deliberate("bert-cond's term placement (pin = 'model') runs on the host, per row, in float32"):
                self._place(run, st, output)
        if st.after is None and (st.forced is None or not bool((st.forced >= 0).any())):
            return None
        t0 = time.perf_counter()
        out = output
        if st.after is not None:
            out = guard_word_ends(out, st.after, st.cont)
        if st.forced is not None:
            where = (st.forced >= 0).nonzero(as_tuple=True)
            if where[0].numel():
                dev = out.device if isinstance(out, torch.Tensor) else out.values.device
                out = force(out, where[0].to(dev), where[1].to(dev), st.forced[where].to(dev))
        st.guard_s += time.perf_counter() - t0
        return out

    def _place(self, run, st: "BertCondState", output) -> None:
        """pin = 'model': one step of placement on the model's own probabilities at this step
        (``place.py``), before the sampler draws, so a term placed now is committed now."""
        if all(pl.done for pl in st.placers):
            return
        t0 = time.perf_counter()
        masked = st.masked
        logits = output if isinstance(output, torch.Tensor) else output.dense()
        deadline = run.step + 1 >= max(1, math.ceil(self.config.place_by * run.num_steps))
        new_after = []
        for r, pl in enumerate(st.placers):
            if pl.done:
                continue
            logp = logits[r].float().log_softmax(-1).cpu()
            for j in pl.step(logp, masked[r], st.reserved[r], run.step, deadline):
                pos, ids = pl.placed[j], pl.terms[j]
                st.forced[r, pos:pos + len(ids)] = torch.tensor(ids)
                e = pos + len(ids)
                if st.cont is not None and e < st.forced.shape[1] and not bool(st.reserved[r, e]):
                    new_after.append((r, e))
        if new_after:
            rows = torch.tensor([a for a, _ in new_after])
            cols = torch.tensor([b for _, b in new_after])
            if st.after is not None:
                rows, cols = torch.cat([st.after[0].cpu(), rows]), torch.cat([st.after[1].cpu(), cols])
            st.after = (rows, cols)
        st.place_s += time.perf_counter() - t0

    @hookimpl
    def diffaccel_post_step(self, run, output) -> None:
        # how often the pinned positions were computed, beside the free ones: a strategy that
        # narrows steps (swd) should compute pinned tokens only as neighbours of changing ones
        st = run.state(self)
        if st.placers is not None and output.masked is not None:
            st.masked = output.masked.cpu()
            # committed positions no longer need forcing: the sampler never re-masks them
            st.forced[~st.masked & (st.forced >= 0)] = -1
        if run.pinned is None:
            pin = st.reserved if st.reserved is not None else torch.zeros(output.tokens.shape, dtype=torch.bool)
            st.pinned = int(pin.sum())
        else:
            pin = st.pin_mask
            if pin is None:
                pin = st.pin_mask = run.pinned >= 0
        if output.computed is None:
            st.pin_computed += int(pin.sum())
            st.free_computed += int((~pin).sum())
        else:
            computed = output.computed.to(pin.device)  # (B, N) bool
            st.pin_computed += int((computed & pin).sum())
            st.free_computed += int((computed & ~pin).sum())
        st.steps_seen += 1
        if run.condition is not None:
            self._vector_step(run, st)

    def _vector_step(self, run, st: "BertCondState") -> None:
        """Count the step for the rows the vector drove; with vector_until = 'placed', a row
        whose terms are all placed runs unconditioned from the next step (its vector zeroed: the
        model then adds no projection for it), and once every row has, the batch drops it."""
        given = run.condition.ne(0).any(-1)
        for r in given.nonzero().flatten().tolist():
            st.vector_steps[r] += 1
        if self.config.vector_until != "placed" or st.placers is None:
            return
        done = torch.tensor([pl.done for pl in st.placers])
        if bool(done.all()):
            run.condition = None
        elif bool((done & given.cpu()).any()):
            run.condition = run.condition.masked_fill(done.to(run.condition.device)[:, None], 0.0)

    @hookimpl(wrapper=True)
    def diffaccel_finalize(self, run, final):
        # a wrapper: this runs after every strategy and the default chose the tokens
        result = yield
        st = run.state(self)
        tokens = final.tokens if final.base is None else torch.where(final.fixed, final.base, final.tokens)
        tok = run.info.tokens.tokenizer
        texts = [tok.decode(row.tolist()) for row in tokens.cpu()]
        found = [presence(c.terms, t) for c, t in zip(st.conditions, texts)]
        run_s = time.perf_counter() - st.t0
        steps, free = st.steps_seen, tokens.numel() - st.pinned
        run.metrics[self.name] = {
            "sources": [i + 1 for i in st.rows],
            "terms": [list(c.terms) for c in st.conditions],
            "scores": [list(c.scores) for c in st.conditions],
            "present": found,
            "key_term_recall": recall(found),
            "pinned_positions": st.pinned,
            # share of (position, step) pairs computed, pinned positions vs free ones
            "pinned_computed_share": st.pin_computed / (st.pinned * steps) if st.pinned and steps else 0.0,
            "free_computed_share": st.free_computed / (free * steps) if free and steps else 0.0,
            "stage_one_s": st.stage_one_s,
            "plan_s": st.plan_s,
            "guard_s": st.guard_s,
            "run_s": run_s,
            "stage_one_share": st.stage_one_s / run_s if run_s > 0 else 0.0,
            "encoder": self.config.bert,
            "encoder_load_s": self.load_seconds,
            "vector_used": any(st.vector_steps),
            # per row, the share of the run's steps that its condition vector drove the model
            "vector_share": [n / steps if steps else 0.0 for n in st.vector_steps],
            "pin": self.config.pin,
            "place_s": st.place_s,
            "placed": [list(p.placed) for p in st.placers] if st.placers else None,
            "placed_at_step": [list(p.at_step) for p in st.placers] if st.placers else None,
        }
        return result

    @hookimpl
    def diffaccel_run_end(self, run) -> None:
        st = run.state(self)
        st.after = st.cont = st.pin_mask = st.forced = st.reserved = st.masked = None

    # -- bench ---------------------------------------------------------------------------------
    def terms_of(self, source: str) -> tuple[str, ...]:
        """The key terms this strategy extracts from ``source`` (extracted once per source)."""
        if source not in self._bench_terms:
            self._bench_terms[source] = self.condition_of(source).terms
        return self._bench_terms[source]

    def presence_of(self, source: str, text: str) -> list[bool]:
        """Which of the terms this strategy extracts from ``source`` appear in ``text``."""
        return presence(self.terms_of(source), text)

    @hookimpl
    def diffaccel_bench_quality(self, outputs: list[Any], seeds: list[int]) -> dict[str, float]:
        """Key-term recall of any entry's outputs, against the terms this strategy extracts for
        the same seeds (so the unconditioned baseline is scored on the same terms), and where the
        runs were conditioned the mean stage-one share and placement share (the pinning's own
        work, share of the run)."""
        found, shares, place = [], [], []
        for out, seed in zip(outputs, seeds):
            for r, text in enumerate(out.texts):
                found.append(self.presence_of(self.sources[self.source_index(seed + r)], text))
            m = out.report.get("strategies", {}).get(self.name)
            if m:
                shares.append(m["stage_one_share"])
                place.append(m["place_s"] / m["run_s"] if m["run_s"] > 0 else 0.0)
        q = {"key_term_recall": recall(found)}
        if shares:
            q["stage_one_share"] = sum(shares) / len(shares)
            q["placement_share"] = sum(place) / len(place)
        return q
