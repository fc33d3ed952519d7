"""The adapter contract: what the core needs from a model family, in one typed protocol.

An adapter is a plugin like a strategy: a distribution names it in the ``diffaccel.adapters``
entry-point group (``text = "pkg.module:TextAdapter"``); the entry-point name is what
``[model] adapter = "..."`` selects. The shipped adapters register that way, from diffaccel's own
pyproject.toml (``diffaccel plugins`` lists every installed one), and nothing in the core knows
their names.

An adapter's run drives the core's step sequence (``diffaccel.runtime.sequence.RunSequence``), which
calls the hooks in order and keeps the run's counters; the adapter sets
``run.positions_per_layer`` and ``run.info`` and routes each layer through
``accelerator.layer_output``. ``diffaccel.testing.check_adapter`` checks an adapter against this
contract; docs/writing-an-adapter.md is the guide (generated in part from this module).

The object the entry point names (a class with static methods, or an instance) must provide every
member of ``Adapter``; ``diffaccel plugins --check`` and the first use verify it
(``missing_members``). What the adapter's layers and steps offer to strategies is its
``capabilities`` (``diffaccel.contract.capabilities``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import attrs


@runtime_checkable
class Adapter(Protocol):
    """One model family: loads its pipelines, runs them, and routes their layers through the hooks."""

    name: str
    """The entry-point name, as ``[model] adapter`` writes it (set from the entry point)."""
    Options: type
    """Frozen attrs class of the ``[model]`` keys only this adapter reads."""
    capabilities: frozenset[str]
    """What its layers and steps offer strategies (``diffaccel.contract.capabilities``)."""
    PEERS: Mapping[str, type]
    """Other libraries' accelerators ``bench`` may compare (``[[peer]] use = name``): name -> attrs
    class of the peer's keys. Empty when it offers none."""
    layer_types: tuple[type, ...]
    """The ``diffaccel.Layer`` subclasses its ``layer_output`` calls hand to strategies (documented
    in docs/writing-a-plugin.md)."""

    def accepts(self, pipe: Any) -> bool:
        """Whether this adapter drives ``pipe`` (``diffaccel.apply`` picks the first that does)."""

    def load(self, config: Any) -> Any:
        """The pipeline a ``RunConfig`` names; raises ``ModelLoadError`` / ``ConfigError`` (one line)."""

    def info(self, pipe: Any) -> dict[str, Any]:
        """Model facts handed to ``diffaccel_setup`` (``n_layers``, ``layers``, ``capabilities``...)."""

    def attach(self, pipe: Any, accelerator: Any) -> None:
        """Route ``pipe``'s steps and layers through ``accelerator`` (a ``diffaccel.Accelerator``)."""

    def detach(self, pipe: Any) -> None:
        """Remove every hook: ``pipe`` behaves bitwise as if it never had any."""

    def run(self, pipe: Any, config: Any, seed: int, progress: bool = True, **extra: Any) -> Any:
        """One generation of ``config.model.batch`` rows from ``seed``; the output has ``.report``
        (``RunState.report()``)."""

    def reference_run(self, pipe: Any, config: Any, seed: int) -> Any | None:
        """The unaccelerated run slightly perturbed (its agreement with the baseline is ``bench``'s
        noise floor), or None when the adapter has no such notion."""

    def write(self, outputs: list[Any], out: str | None) -> str:
        """Write outputs (``generate --out``); returns where."""

    def quality(self, baseline: list[Any], outputs: list[Any], references: list[Any] | None = None) -> dict[str, float]:
        """``bench``'s quality columns: ``outputs`` against the unaccelerated ``baseline`` of the same seeds."""

    def peer_name(self, entry: Any) -> str:
        """``bench``'s entry name for a ``[[peer]]`` table (a ``PeerEntry``)."""

    def peer_context(self, pipe: Any, peer: Any) -> AbstractContextManager[Any]:
        """Apply a peer accelerator (an instance of a ``PEERS`` class) for a ``with`` block."""


@runtime_checkable
class WritesFiles(Protocol):
    """Optional: an adapter whose ``write`` makes files of one kind (unet: a PNG grid). ``generate``
    then checks ``--out`` ends in ``output_suffix`` before loading the model, and writes
    ``<config name><output_suffix>`` in the current folder when ``--out`` is not given."""

    output_suffix: str


@runtime_checkable
class KnowsFacts(Protocol):
    """Optional: ``diffaccel check`` runs each strategy's ``diffaccel_setup`` with these facts, so
    that it refuses what ``generate`` would (the shipped adapters have it)."""

    def facts(self, config: Any) -> dict[str, Any]:
        """What ``info(pipe)`` says of the model ``config`` names (at least the keys strategies'
        setups read: ``vocab_size``, ``n_layers``, ``layers``, ``capabilities``...), read from its
        config files without loading the weights, and the ``[model]`` options checked against
        them as ``load`` checks them; ``ModelLoadError`` / ``ConfigError`` (one line, the same
        line as ``load``'s) where ``load`` would refuse."""


@runtime_checkable
class TimesPartialSteps(Protocol):
    """Optional: ``diffaccel partial`` (adapters declaring ``token-positions``)."""

    def time_partial_steps(self, pipe: Any, config: Any, fractions: tuple[float, ...], repeats: int) -> dict[float, list[float]]:
        """Seconds of one denoiser step computing each fraction of the positions (rows choosing their
        own), ``repeats`` times, interleaved; fraction 1.0 is the full step."""


@runtime_checkable
class MeasuresFluency(Protocol):
    """Optional: ``diffaccel fluency`` (text adapters)."""

    def fluency_rows(self, pipe: Any, config: Any, seeds: int) -> Iterator[tuple[str, dict[str, float]]]:
        """(row name, quality dict with ``perplexity``, ``distinct_1``, ``distinct_2``) of the model's
        samples and of reference texts; the first row is the model's. Adapters that are also
        ``JudgesSamples`` take ``judge=`` and add ``gen_ppl``."""


@runtime_checkable
class JudgesSamples(Protocol):
    """Optional: ``gen_ppl`` in ``bench`` and ``fluency`` (text adapters): a language model scores the samples."""

    def load_judge(self, spec: str | None) -> Any:
        """A judge (``name``, ``score(lines)`` -> per-line NLL sums and token counts) named by
        ``--judge`` (None: the adapter's default); one ``DiffaccelError`` if it does not load."""

    def judge_lines(self, outputs: list[Any]) -> list[str]:
        """The lines of ``outputs`` that the judge scores."""


@runtime_checkable
class WritesItems(Protocol):
    """Optional: ``diffaccel generate --prompts`` (one item per line, results.jsonl; ``diffaccel.runtime.jobs``)."""

    def write_item(self, output: Any, out_dir: Any, stem: str) -> dict[str, Any]:
        """Write one item's files (a one-row ``output``) into ``out_dir`` as ``stem.*``, each under a
        temporary name and then renamed; return its JSON fields for results.jsonl (``text``, ``image``)."""


@runtime_checkable
class ReportsQuality(Protocol):
    """Optional: the quality keys ``quality`` returns for a config, known before anything loads
    (``diffaccel tune`` checks its budgets against them)."""

    def quality_keys(self, config: Any) -> list[str]:
        """The keys of ``quality(baseline, outputs)`` for runs of ``config`` (without the judge's
        ``gen_ppl``, which the bench adds)."""


@runtime_checkable
class PoolsQuality(Protocol):
    """Optional: ``quality`` from per-seed parts. The bench's intervals compute quality again on
    each resample of the seeds (``stats.pooled_ci``); with parts, each seed's own work (an image's
    PSNR, a classifier's prediction) is done once and only the pooling is repeated."""

    def quality_parts(self, baseline: list[Any], outputs: list[Any], references: list[Any] | None = None) -> list[Any]:
        """One part per seed (``outputs[i]`` against ``baseline[i]``): what pooling needs of it."""

    def quality_of_parts(self, parts: list[Any]) -> dict[str, float]:
        """``quality`` of the seeds whose parts these are (a part may repeat: a resample); equal
        to ``quality(baseline, outputs, references)`` on all of them."""


@runtime_checkable
class PeersRunOtherConfigs(Protocol):
    """Optional: a ``[[peer]]`` entry that runs another config than the baseline's (the text
    adapter's ``steps`` peer: the same model with fewer steps)."""

    def peer_run_config(self, config: Any, peer: Any) -> Any:
        """The ``RunConfig`` a peer entry runs (``peer``: an instance of a ``PEERS`` class)."""


@runtime_checkable
class StreamsBlocks(Protocol):
    """Optional: ``diffaccel serve`` streams (``stream: true``) the runs of a model that makes its
    output final block by block, in order (block diffusion, semi-autoregressive masked sampling):
    each block is sent once committed. While such a run goes, the adapter keeps a ``Committed``
    in ``run.info.extra["committed"]``, updated as blocks commit, read at every ``pre_step``."""

    def block_length(self, pipe: Any, config: Any) -> int | None:
        """Positions per block when the runs of ``config`` commit more than one block in order,
        each final once committed (``Committed``); None when every position may change until the
        run ends (one block, or a sampler without blocks)."""


@attrs.define
class Committed:
    """What a run of a ``StreamsBlocks`` adapter has made final so far, per batch row."""

    counts: list[int]
    """Per row, its positions final so far: it grows as the row's blocks commit, and those
    positions never change again."""
    text: Callable[[int], str]
    """``text(row)``: the text of those positions, decoded as the output's ``texts`` are (so the
    row's final text begins with it, up to how the tokenizer joins pieces at the edge)."""


def missing_members(adapter: Any) -> list[str]:
    """Members of ``Adapter`` that ``adapter`` lacks (an empty list: it conforms)."""
    return [n for n in MEMBERS if not hasattr(adapter, n)]


MEMBERS = tuple(sorted({*Adapter.__annotations__, *(n for n, v in vars(Adapter).items()
                                                    if callable(v) and not n.startswith("_"))}))
"""Every member name of the ``Adapter`` protocol."""
