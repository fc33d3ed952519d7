"""Facts about one run that strategies read (``run.info``), scoped by capability, not by model family.

``RunInfo`` holds the facts every adapter gives (checkpoint, seeds, the layers a step runs) and
three groups, each filled by the adapters whose models have that capability and left empty
(every fact None) by the others:

* ``run.info.tokens`` (``TokenFacts``): what runs over token positions report (length, vocabulary,
  sampler, tokenizer, the sampler's draw);
* ``run.info.stack`` (``StackFacts``): how the generation and the denoiser are built of blocks
  (blocks of a block-wise generation and their canvas; the depth and kind of each block of an
  encoder-decoder stack; inner modules hooked);
* ``run.info.images`` (``ImageFacts``): what image runs report (latent size, guidance, timesteps).

Adapters set facts by name with ``run.info.set(...)`` (a group's fact by its own name:
``set(length=8)`` sets ``run.info.tokens.length``). The flat attributes these facts had before
the groups (``run.info.length``) read and write through to their group for one minor release,
each with a DeprecationWarning naming the new place; so does the dict form (``run.info["length"]``).
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs


@attrs.define(kw_only=True)
class TokenFacts:
    """Facts of runs over token positions (text models)."""

    length: int | None = None
    """Positions per row (block-wise generation: of the active canvas)."""
    vocab_size: int | None = None
    """The vocabulary size (the logits' last dimension)."""
    kind: str | None = None
    """The model's kind (``masked``, ``continuous``, ``block``)."""
    sampler: str | None = None
    """The sampler of this run (``masked``, ``ddim``, ``ddpm``, ``hybrid``, ``block``)."""
    temperature: float | None = None
    """The sampling temperature."""
    block_size: int | None = None
    """The masked sampler's semi-autoregressive blocks: block b is positions ``b * block_size`` to
    ``(b + 1) * block_size`` (the last one may be shorter), filled in order, a row's active block
    the one holding its first masked position; None: one block."""
    tokenizer: Any = None
    """The tokenizer (``encode(text)``, ``decode(ids)``)."""
    prompt_lengths: list[int] | None = None
    """Per row, the prompt's tokens at the start of the sequence."""
    cond_dim: int | None = None
    """The width of ``run.condition`` the model takes (0: none)."""
    truncated_logits: Any = None
    """(``token-logits``) ``truncated_logits(values, indices, vocab_size)`` builds logits a sampler
    draws from without a dense tensor."""
    draw_tokens: Any = None
    """(``token-logits``) ``draw_tokens(logits, temperature, generator)`` -> (confidence, token) per
    row of (M, V) logits or of a truncated slice (``truncated_logits(...).rows``): the masked
    sampler's own draw, the model's special tokens never drawn."""


@attrs.define(kw_only=True)
class StackFacts:
    """How the generation and the denoiser are built of blocks."""

    blocks: int | None = None
    """Block-wise generation (DiffusionGemma): blocks of the generation."""
    canvas_length: int | None = None
    """Block-wise generation: positions per block (canvas)."""
    depths: list[int] | None = None
    """Block stacks (``block-stack``: UNet, DiT): per layer, its depth (0 outermost)."""
    kinds: list[str] | None = None
    """Block stacks: per layer, ``down``, ``mid`` or ``up``."""
    modules: list[str] | None = None
    """Inner modules of the blocks hooked at this run (``inner-modules``, ``hooked_modules``)."""


@attrs.define(kw_only=True)
class ImageFacts:
    """Facts of image runs."""

    sample_size: Any = None
    """The denoiser's latent size."""
    in_channels: int | None = None
    """The denoiser's latent channels."""
    guidance: bool | None = None
    """Whether classifier-free guidance runs."""
    cfg_mode: str | None = None
    """``batched``, ``unbatched`` (two denoiser calls per step) or ``none``."""
    timesteps: list[float] | None = None
    """The scheduler's timesteps of the run."""
    prompts: list[str] | None = None
    """Per row, its prompt."""


GROUPS: dict[str, type] = {"tokens": TokenFacts, "stack": StackFacts, "images": ImageFacts}
"""Group attribute of ``RunInfo`` -> its class."""

GROUPED: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in attrs.fields(cls)}
"""A group's fact (its flat name of before the groups, the same as in the group) -> the group holding it."""


def new_name(key: str) -> str:
    """Where fact ``key`` is read now: ``run.info.tokens.length``, ``run.info.seeds``, ``run.info.extra['x']``."""
    if key in GROUPED:
        return f"run.info.{GROUPED[key]}.{key}"
    return f"run.info.{key}" if key in RUN_INFO_FIELDS else f"run.info.extra[{key!r}]"


def _deprecated_key(key: str) -> None:
    warnings.warn(f"run.info[{key!r}] (dict access to run info) is deprecated; use {new_name(key)}",
                  DeprecationWarning, stacklevel=3)


def _flat(name: str, group: str) -> property:
    """The flat attribute ``run.info.<name>`` (before the groups), read and written through to its group."""
    message = f"run.info.{name} is deprecated; use run.info.{group}.{name}"

    def get(self: "RunInfo") -> Any:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(getattr(self, group), name)

    def set_(self: "RunInfo", value: Any) -> None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        setattr(getattr(self, group), name, value)

    return property(get, set_, doc=f"Deprecated: ``{message.split('use ')[1]}``.")


@attrs.define(kw_only=True, init=False)
class RunInfo:
    """Facts about one run that strategies may read as attributes: those every adapter gives
    (``run.info.checkpoint``) and, by capability, ``run.info.tokens`` (``TokenFacts``),
    ``run.info.stack`` (``StackFacts``) and ``run.info.images`` (``ImageFacts``). Adapters fill the
    facts that apply to them (``run.info.set(...)``); a fact not filled is None. Facts beyond these
    go in ``extra``. The flat attributes of before the groups (``run.info.length``) and the dict form
    (``run.info["length"]``) still work for one minor release, with a DeprecationWarning naming
    the new place."""

    checkpoint: str | None = None
    """The model's checkpoint (as ``[model] checkpoint`` names it, or the pipeline's name)."""
    seeds: list[int] | None = None
    """Per batch row: the seed it was generated from."""
    n_layers: int | None = None
    """Layers or blocks the denoiser runs per step (through ``layer_output``)."""
    layers: list[str] | None = None
    """Their names, in forward order (text layers: None, ``block.{i}``; DiffusionGemma: ``decoder.{i}``)."""
    time_conditioned: bool | None = None
    """Whether the denoiser reads the time step (a step's output can change with equal inputs)."""
    pins: bool | None = None
    """Whether the adapter honours ``run.pinned`` at this run (False: it ignores it)."""
    tokens: TokenFacts = attrs.Factory(TokenFacts)
    """Facts of runs over token positions (``TokenFacts``)."""
    stack: StackFacts = attrs.Factory(StackFacts)
    """Block-wise generation and block stacks (``StackFacts``)."""
    images: ImageFacts = attrs.Factory(ImageFacts)
    """Facts of image runs (``ImageFacts``)."""
    extra: dict[str, Any] = attrs.Factory(dict)
    """Adapter facts beyond those above."""

    def __init__(self, **facts: Any) -> None:
        old = {k: facts.pop(k) for k in list(facts) if k in GROUPED}
        self.__attrs_init__(**facts)
        for k, v in old.items():
            warnings.warn(f"RunInfo({k}=...) is deprecated; use RunInfo({GROUPED[k]}={GROUPS[GROUPED[k]].__name__}({k}=...)) "
                          f"or run.info.set({k}=...)", DeprecationWarning, stacklevel=2)
            setattr(getattr(self, GROUPED[k]), k, v)

    def as_dict(self) -> dict[str, Any]:
        """The facts given, as one flat dict by fact name (facts that are None left out), ``extra`` merged in."""
        d = {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None and k not in GROUPS and k != "extra"}
        for group in GROUPS:
            d.update((k, v) for k, v in attrs.asdict(getattr(self, group), recurse=False).items() if v is not None)
        d.update(self.extra)
        return d

    def set(self, **facts: Any) -> "RunInfo":
        """Set facts by name (a field here, a group's fact by its name, or else ``extra``);
        returns self (for adapters): ``run.info.set(checkpoint=..., length=8)``."""
        for k, v in facts.items():
            group = GROUPED.get(k)
            if group is not None:
                setattr(getattr(self, group), k, v)
            elif k in RUN_INFO_FIELDS:
                setattr(self, k, v)
            else:
                self.extra[k] = v
        return self

    def _lookup(self, key: str) -> Any:
        group = GROUPED.get(key)
        if group is not None:
            return getattr(getattr(self, group), key)
        return getattr(self, key) if key in RUN_INFO_FIELDS else self.extra.get(key)

    # -- the deprecated dict form (one minor release) ---------------------------------------------
    def __getitem__(self, key: str) -> Any:
        _deprecated_key(key)
        value = self._lookup(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        _deprecated_key(key)
        value = self._lookup(key)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        _deprecated_key(key)
        return self._lookup(key) is not None

    def __setitem__(self, key: str, value: Any) -> None:
        _deprecated_key(key)
        self.set(**{key: value})

    def update(self, *args: Any, **facts: Any) -> None:
        warnings.warn("run.info.update(...) is deprecated; set the attributes (run.info.tokens.length = ...) or use "
                      "run.info.set(...)", DeprecationWarning, stacklevel=2)
        self.set(**dict(*args, **facts))


RUN_INFO_FIELDS = frozenset(f.name for f in attrs.fields(RunInfo)) - {"extra"} - set(GROUPS)
"""The facts ``RunInfo`` holds itself (its groups and ``extra`` aside)."""

for _name, _group in GROUPED.items():  # the flat attributes of before the groups, deprecated
    setattr(RunInfo, _name, _flat(_name, _group))
del _name, _group
