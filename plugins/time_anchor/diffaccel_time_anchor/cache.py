"""The latent cache: bounded, versioned entries keyed by (row, layer, slot), with LRU eviction.

A *key* is one (batch row, layer, slot) of a dense key space, ``key = (row * n_layers + layer) *
n_slots + slot``; a slot is a position, every n-th position (stride) or a position cluster (text),
or the whole block output of a row (UNet). The key space is per generation and per guidance
branch (one cache per ``run.state``), so rows and branches never share an entry.

An *entry* holds, for its key:

* ``version``: the step it was written; an entry older than ``max_age`` steps is never served
  (``live`` reports it stale and the caller recomputes the state);
* ``anchored`` and ``anchor_id``: whether the state was judged settled when it was written, and
  which anchor of that key this is (a key that is re-anchored after a change gets a new id);
* ``values``: the reference states of the key's positions (``per_key`` rows of ``width``
  numbers, float16 with ``fp16``), the outputs the change test compares the next computation
  with.

Bookkeeping is dense per key (a few int64 per key); the values live in a pool of
``capacity = min(keys, max_entries, max_bytes // entry_bytes)`` rows allocated at the first
write, so neither bound can be exceeded: a write that needs more rows evicts the least recently
used entries (written or served longest ago) and drops what still does not fit. Everything stays
on the device of the first tensor written; counters are tensors until ``stats()``.
"""

from __future__ import annotations

import torch


class LatentCache:
    def __init__(self, n_keys: int, width: int, per_key: int = 1, *, max_entries: int, max_bytes: int,
                 max_age: int, fp16: bool = False, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        self.n_keys, self.width, self.per_key = n_keys, width, per_key
        self.max_age = max_age
        self.max_entries, self.max_bytes = max_entries, max_bytes
        # the model's dtype (``dtype``: that of the states it caches), or float16 where asked
        self.dtype = torch.float16 if fp16 else dtype
        self.entry_bytes = per_key * width * (torch.finfo(self.dtype).bits // 8)
        self.capacity = min(n_keys, max_entries, max_bytes // self.entry_bytes)
        self.device = torch.device(device)
        self.values: torch.Tensor | None = None  # (capacity, per_key, width), allocated at the first write
        self.clear()

    def clear(self) -> None:
        """Drop every entry and reset the statistics (called at the start of every generation)."""
        dev, n = self.device, self.n_keys
        self.version = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.anchored = torch.zeros(n, dtype=torch.bool, device=dev)
        self.anchor_id = torch.zeros(n, dtype=torch.long, device=dev)
        self.last_used = torch.zeros(n, dtype=torch.long, device=dev)
        self.row_of = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.key_of = torch.full((self.capacity,), -1, dtype=torch.long, device=dev)
        self.values = None
        self.all_held = False  # every key holds a row: no allocation, no eviction from here on
        self.clock = 0
        self.n_entries = 0
        self.peak_entries = 0
        self.stale = torch.zeros((), dtype=torch.long, device=dev)
        self.evictions = 0
        self.dropped = 0
        self.anchors_made = torch.zeros((), dtype=torch.long, device=dev)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of the entries held now (values only; the bookkeeping is a few int64 per key)."""
        return self.n_entries * self.entry_bytes

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the value pool actually allocated (never above ``max_bytes``)."""
        return 0 if self.values is None else self.values.numel() * self.values.element_size()

    # -- serving -----------------------------------------------------------------------------
    def live(self, keys: torch.Tensor, step: int, max_age: torch.Tensor | None = None) -> torch.Tensor:
        """Bool mask over ``keys`` (any shape, -1 = not cacheable): an anchored entry written at
        most ``max_age`` steps ago exists, so the state may be served. Stale anchored entries are
        counted (``stale``): their states must be recomputed. Served entries become most recent.
        ``max_age``: a per-key bound broadcast against ``keys`` (default: the cache's)."""
        valid = keys >= 0
        k = keys.clamp(min=0)
        held = valid & (self.row_of[k] >= 0) & self.anchored[k]
        fresh = (step - self.version[k]) <= (self.max_age if max_age is None else max_age)
        live = held & fresh
        self.stale += (held & ~fresh).sum()
        self.clock += 1
        self.last_used[k[live]] = self.clock
        return live

    def read(self, keys: torch.Tensor, ranks: torch.Tensor | int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference states (``keys.shape + (width,)``, in the cache's dtype, zeros where none)
        and a mask of where an entry exists."""
        valid = keys >= 0
        rows = self._take(self.row_of, keys.clamp(min=0))
        has = valid & (rows >= 0)
        if self.values is None:
            return torch.zeros(*keys.shape, self.width, device=self.device, dtype=self.dtype), has
        if isinstance(ranks, int) and keys.dim() == 1:  # one state per key: whole rows of the pool
            vals = self.values[:, ranks].index_select(0, rows.clamp(min=0))
        else:
            vals = self.values[rows.clamp(min=0), ranks]
        return vals * has.unsqueeze(-1), has

    def age(self, keys: torch.Tensor, step: int) -> torch.Tensor:
        """Steps since each key's entry was written (meaningless where there is none)."""
        return step - self._take(self.version, keys.clamp(min=0))

    # -- writing -----------------------------------------------------------------------------
    def write(self, keys: torch.Tensor, step: int, anchored: torch.Tensor) -> torch.Tensor:
        """Write entries for the distinct ``keys`` (1-D, all >= 0) at ``step``; ``anchored`` says
        which are settled. Returns the pool row of each key (-1 where the bounds left no room)."""
        rows = self._ensure_rows(keys)
        ok = rows >= 0
        k = keys[ok]
        a = anchored[ok]
        newly = a & ~(self.anchored[k] & (self.version[k] >= 0))
        self.anchor_id[k] += newly.long()
        self.anchors_made += newly.sum()
        self.version[k] = step
        self.anchored[k] = a
        self.clock += 1
        self.last_used[k] = self.clock
        return rows

    def store(self, keys: torch.Tensor, values: torch.Tensor, ranks: torch.Tensor | int = 0) -> None:
        """Put reference states (``keys.shape + (width,)``) into the entries of ``keys``
        (written before by ``write``); keys without an entry are ignored."""
        if self.values is None:
            if self.capacity == 0:
                return
            self.values = torch.zeros(self.capacity, self.per_key, self.width, dtype=self.dtype, device=self.device)
        rows = self.row_of[keys.clamp(min=0)]
        ok = (keys >= 0) & (rows >= 0)
        if isinstance(ranks, torch.Tensor):
            ranks = ranks[ok]
        self.values[rows[ok], ranks] = values[ok].to(self.dtype)

    def put(self, keys: torch.Tensor, step: int, anchored: torch.Tensor, values: torch.Tensor,
            ranks: torch.Tensor | int = 0) -> None:
        """``write`` then ``store``, for distinct ``keys`` (1-D) and their ``values`` (n, width).
        Once every key holds a row (the usual case: the bounds fit the run), without any
        allocation check: the hot path of the text strategy."""
        if not self.all_held:
            self.write(keys, step, anchored)
            self.store(keys, values, ranks)
            self.all_held = self.n_entries == self.n_keys
            return
        newly = anchored & ~self.anchored.index_select(0, keys)
        self.anchor_id.index_add_(0, keys, newly.long())
        self.anchors_made += newly.sum()
        self.version.index_fill_(0, keys, step)
        self.anchored.index_copy_(0, keys, anchored)
        self.clock += 1
        self.last_used.index_fill_(0, keys, self.clock)
        rows = self.row_of.index_select(0, keys)
        if isinstance(ranks, int):
            self.values[:, ranks].index_copy_(0, rows, values.to(self.dtype))
        else:
            self.values[rows, ranks] = values.to(self.dtype)

    def _ensure_rows(self, keys: torch.Tensor) -> torch.Tensor:
        rows = self.row_of[keys]
        new = rows < 0
        n_new = int(new.sum())
        if n_new == 0:
            return rows
        free = (self.key_of < 0).nonzero().squeeze(1)
        if n_new > free.numel():
            self._evict(n_new - free.numel(), protect=keys)
            free = (self.key_of < 0).nonzero().squeeze(1)
        take = min(n_new, free.numel())
        new_keys = keys[new]
        placed, lost = new_keys[:take], new_keys[take:]
        self.row_of[placed] = free[:take]
        self.key_of[free[:take]] = placed
        self.dropped += int(lost.numel())
        self.n_entries += take
        self.peak_entries = max(self.peak_entries, self.n_entries)
        return self.row_of[keys]

    def _evict(self, n: int, protect: torch.Tensor) -> None:
        """Free ``n`` rows, least recently used first, never one of the keys being written."""
        rows = (self.key_of >= 0).nonzero().squeeze(1)
        owners = self.key_of[rows]
        keep = torch.isin(owners, protect)
        rows, owners = rows[~keep], owners[~keep]
        if rows.numel() == 0:
            return
        order = torch.argsort(self.last_used[owners], stable=True)[:n]
        gone_rows, gone_keys = rows[order], owners[order]
        self.key_of[gone_rows] = -1
        self.row_of[gone_keys] = -1
        self.version[gone_keys] = -1
        self.anchored[gone_keys] = False
        self.n_entries -= int(gone_rows.numel())
        self.evictions += int(gone_rows.numel())

    @staticmethod
    def _take(table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``table[keys]`` for a 1-D table: ``index_select`` (advanced indexing cost several
        times more per call on the few hundred keys of a step)."""
        return table.index_select(0, keys.reshape(-1)).view(keys.shape)

    def stats(self) -> dict[str, int]:
        return {"entries": self.n_entries, "peak_entries": self.peak_entries,
                "peak_bytes": self.peak_entries * self.entry_bytes, "allocated_bytes": self.allocated_bytes,
                "capacity": self.capacity, "stale": int(self.stale),
                "evictions": self.evictions, "dropped": self.dropped, "anchors_made": int(self.anchors_made)}
