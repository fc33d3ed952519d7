"""The latent cache alone: versions and max_age, LRU under entry and byte bounds, fp16, rows."""

from __future__ import annotations

import torch

from diffaccel_time_anchor import LatentCache


def make(n_keys=16, width=8, **kw):
    kw = {"max_entries": 2**20, "max_bytes": 2**30, "max_age": 2, **kw}
    return LatentCache(n_keys, width, **kw)


def put(cache, keys, step, anchored=True, value=1.0):
    keys = torch.as_tensor(keys)
    cache.write(keys, step, torch.full(keys.shape, anchored))
    cache.store(keys, torch.full((*keys.shape, cache.width), float(value)))


def test_an_entry_is_served_for_max_age_steps_then_recomputed():
    c = make(max_age=2)
    put(c, [3], step=10)
    keys = torch.tensor([3])
    assert [bool(c.live(keys, s)) for s in (11, 12)] == [True, True]
    assert int(c.stale) == 0
    assert not bool(c.live(keys, 13))  # older than max_age: never served
    assert c.stats()["stale"] == 1
    put(c, [3], step=13)  # recomputed and written again: a fresh version
    assert bool(c.live(keys, 15)) and c.age(keys, 15).item() == 2


def test_only_anchored_entries_are_served_and_values_read_back():
    c = make()
    put(c, [1], step=0, anchored=False, value=2.0)
    put(c, [2], step=0, anchored=True, value=5.0)
    assert c.live(torch.tensor([1, 2, -1]), 1).tolist() == [False, True, False]
    vals, has = c.read(torch.tensor([1, 2, 7]))
    assert has.tolist() == [True, True, False]
    assert vals[:, 0].tolist() == [2.0, 5.0, 0.0]


def test_anchor_ids_count_new_anchors_of_a_key():
    c = make()
    put(c, [4], 0, anchored=True)
    put(c, [4], 1, anchored=True)  # still the same anchor
    put(c, [4], 2, anchored=False)
    put(c, [4], 3, anchored=True)  # a new anchor of the same key
    assert int(c.anchor_id[4]) == 2 and c.stats()["anchors_made"] == 2


def test_entry_bound_evicts_least_recently_used():
    c = make(n_keys=64, max_entries=4)
    put(c, [0, 1, 2, 3], step=0)
    c.live(torch.tensor([0, 1]), 1)  # 0 and 1 are served: most recent
    put(c, [10, 11], step=1)  # needs 2 rows: evicts 2 and 3
    held = (c.row_of >= 0).nonzero().squeeze(1).tolist()
    assert held == [0, 1, 10, 11]
    assert c.stats()["evictions"] == 2 and c.n_entries == 4


def test_byte_bound_driven_far_past_keeps_memory_bounded():
    width = 32
    entry = width * 4
    c = make(n_keys=10_000, width=width, max_bytes=10 * entry + 7)  # room for 10 entries
    assert c.capacity == 10
    for step in range(50):  # asks for 500 entries in all
        put(c, list(range(step * 10, step * 10 + 10)), step=step, value=step)
        assert c.nbytes <= c.max_bytes and c.allocated_bytes <= c.max_bytes
        assert c.n_entries <= 10
    s = c.stats()
    assert s["peak_bytes"] <= c.max_bytes and s["evictions"] == 490
    vals, has = c.read(torch.arange(490, 500))  # the latest survive
    assert has.all() and (vals == 49).all()
    assert not c.read(torch.arange(0, 10))[1].any()


def test_a_write_larger_than_the_bound_drops_the_rest():
    c = make(n_keys=100, max_entries=5)
    rows = c.write(torch.arange(8), 0, torch.ones(8, dtype=torch.bool))
    assert (rows >= 0).sum() == 5 and c.stats()["dropped"] == 3 and c.n_entries == 5


def test_an_entry_larger_than_the_byte_bound_is_never_stored():
    c = make(width=64, max_bytes=100)
    put(c, [0], 0)
    assert c.capacity == 0 and c.n_entries == 0 and c.allocated_bytes == 0
    assert not c.live(torch.tensor([0]), 1).any()


def test_fp16_storage_halves_the_bytes():
    c32, c16 = make(width=8), make(width=8, fp16=True)
    for c in (c32, c16):
        put(c, [0, 1], 0, value=1.5)
    assert c16.values.dtype == torch.float16 and c32.values.dtype == torch.float32
    assert c16.nbytes * 2 == c32.nbytes
    # read back as stored: the strategy compares in the model's dtype (state.rel_change casts)
    assert c16.read(torch.tensor([0]))[0].dtype == torch.float16


def test_the_cache_holds_the_models_dtype():
    """A bfloat16 model's states are cached in bfloat16 (issue 39): half the bytes of float32,
    and the capacity a byte bound allows doubles."""
    c32 = make(width=8, max_bytes=8 * 4 * 3)
    cb = LatentCache(4, 8, max_entries=100, max_bytes=8 * 4 * 3, max_age=10, dtype=torch.bfloat16)
    assert (cb.capacity, c32.capacity) == (4, 3)
    put(cb, [0, 1], 0, value=1.5)
    assert cb.values.dtype == torch.bfloat16 and cb.read(torch.tensor([0]))[0].dtype == torch.bfloat16


def test_rows_do_not_share_entries():
    # key = (row * layers + layer) * slots + slot: row 1's key of the same (layer, slot) differs
    layers, slots = 2, 4
    c = make(n_keys=2 * layers * slots)
    key = lambda row, layer, slot: (row * layers + layer) * slots + slot  # noqa: E731
    put(c, [key(0, 1, 2)], 0)
    assert bool(c.live(torch.tensor([key(0, 1, 2)]), 1))
    assert not bool(c.live(torch.tensor([key(1, 1, 2)]), 1))


def test_clear_drops_everything():
    c = make()
    put(c, [0, 1, 2], 0)
    c.clear()
    assert c.n_entries == 0 and c.values is None and not c.live(torch.arange(3), 1).any()


def test_bench_plot_skips_runs_the_cost_gate_kept_plain(tmp_path):
    """A run whose cost gate kept time-anchor aside reports its verdict, no per-step record: the
    plot is drawn from the others, or not at all (it once failed the whole bench with a KeyError)."""
    from diffaccel_time_anchor.plot import plot_anchored

    plain = {"strategies": {"time-anchor": {"hit_rate": 0.0, "hits": 0, "step_positions": 1.0, "cost_gate": {}}}}
    plot_anchored([plain, plain], "time-anchor", tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    ran = {"strategies": {"time-anchor": {"anchored_by_step": [[0.0, 0.5], [0.2, 0.7]], "layers": ["block.0", "block.1"]}}}
    plot_anchored([plain, ran], "time-anchor", tmp_path / "one.png")
    assert (tmp_path / "one.png").stat().st_size > 1000
