"""Text adapter: samplers, schedules, clipping, batch consistency, partial computation, the lazy top-1
(BERT-family models and loading: test_text_checkpoints.py; commands: test_text_commands.py)."""

import math

import pytest
import torch

from diffaccel import StepPlan, hookimpl
from diffaccel.adapters.text.sampling.model import SCHEDULES, TextDiffusionConfig, TextDiffusionLM, alphas_cumprod, mask_rate
from diffaccel.adapters.text.sampling.positions import Positions
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with


@pytest.mark.parametrize("sampler", ["ddim", "ddpm", "hybrid"])
def test_continuous_samplers_run_and_differ(sampler):
    pipe = tiny_text_pipeline("continuous")
    out = pipe(length=16, steps=9, seed=0, sampler=sampler, progress=False)
    assert out.tokens.shape == (1, 16)
    assert out.report["steps_run"] == 9


def test_hybrid_is_ddim_ddpm_ddim():
    """Hybrid follows DDIM exactly for the first third of the steps, then draws DDPM noise."""
    seen = {}

    class Watch:
        name = "watch"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            seen.setdefault(run.info.tokens.sampler, []).append(output.logits.clone())

    pipe = tiny_text_pipeline("continuous")
    for sampler in ("ddim", "ddpm", "hybrid"):
        run_with(pipe, [Watch()], length=16, steps=9, seed=0, sampler=sampler)
    ddim, ddpm, hybrid = seen["ddim"], seen["ddpm"], seen["hybrid"]
    for s in range(4):  # steps 0..3 see the latents of steps before the first DDPM update (step 3)
        assert torch.equal(hybrid[s], ddim[s])
    assert not torch.equal(hybrid[5], ddim[5])
    assert not torch.equal(ddpm[2], ddim[2])


def test_masked_sampler_commits_every_position():
    pipe = tiny_text_pipeline("masked")
    out = pipe(length=20, steps=7, seed=0, progress=False)
    assert not (out.tokens == pipe.denoiser.mask_id).any()


def test_masked_sampler_one_commit_per_step():
    committed = []

    class Watch:
        name = "watch"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            committed.append(int((~output.masked).sum()))

    pipe = tiny_text_pipeline("masked")
    run_with(pipe, [Watch()], length=12, steps=12)
    assert committed == list(range(1, 13))


def test_semi_autoregressive_blocks_fill_left_to_right():
    order = []

    class Watch:
        name = "watch"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            order.append(output.masked[0].clone())

    pipe = tiny_text_pipeline("masked")
    run_with(pipe, [Watch()], length=16, steps=8, block_size=8)
    after_first_block = order[3]
    assert not after_first_block[:8].any() and after_first_block[8:].all()


def test_prompt_positions_are_kept():
    pipe = tiny_text_pipeline("masked")
    out = pipe("abc", length=12, steps=4, seed=0, progress=False)
    assert out.tokens[0, :3].tolist() == pipe.tokenizer.encode("abc")
    assert out.prompt_lengths == [3]
    cont = tiny_text_pipeline("continuous")
    out = cont("abc", length=12, steps=4, seed=0, progress=False)
    assert out.tokens[0, :3].tolist() == cont.tokenizer.encode("abc")


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_batch_rows_equal_single_runs(kind):
    pipe = tiny_text_pipeline(kind)
    batch = pipe(length=16, steps=6, seed=10, batch=3, progress=False)
    for r in range(3):
        single = pipe(length=16, steps=6, seed=10 + r, batch=1, progress=False)
        assert torch.equal(single.tokens[0], batch.tokens[r]), f"row {r}"


def test_logits_are_clipped():
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, max_len=8, logit_clip=3.0))
    with torch.no_grad():
        model.head.weight.mul_(1000)
        logits = model(torch.randint(0, 50, (2, 8)))
    assert logits.abs().max() <= 3.0
    assert logits.abs().max() > 2.5  # the bound is reached, not just never approached


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedules_are_monotonic(schedule):
    t = torch.linspace(0, 1, 11)
    rate = mask_rate(schedule, t)
    assert rate[0] == 0 and math.isclose(float(rate[-1]), 1.0, rel_tol=1e-6)
    assert (rate[1:] >= rate[:-1]).all()
    ab = alphas_cumprod(schedule, 1000)
    assert (ab[1:] < ab[:-1]).all() and ab[0] > 0.99 and ab[-1] < 0.1


def test_unknown_schedule_is_rejected():
    with pytest.raises(ValueError, match="allowed: linear, cosine, scaled-linear"):
        mask_rate("sigmoid", torch.zeros(1))


def test_positions_are_ragged_and_pad_only_for_attention():
    mask = torch.tensor([[True, False, True, False], [False, False, False, True], [False] * 4])
    sel = Positions(mask)
    assert sel.count == 3 and sel.M == 2
    assert sel.flat.tolist() == [0, 2, 7] and sel.rows.tolist() == [0, 0, 1] and sel.pos.tolist() == [0, 2, 3]
    assert torch.equal(sel.mask(), mask)
    x = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 4, 2)
    rows = sel.gather(x)
    assert torch.equal(rows, x[mask])
    padded = sel.pad(rows)  # (L, M, 2): row 1 holds one pair; row 2 has none and is left out
    assert padded.shape == (2, 2, 2) and torch.equal(padded[1, 0], x[1, 3]) and not padded[1, 1].any()
    assert torch.equal(sel.unpad(padded), rows)
    assert sel.L == 2 and torch.equal(sel.live_rows(x), x[:2])  # the keys and values attention reads
    full = Positions(torch.ones(3, 4, dtype=torch.bool))
    assert full.live is None and full.live_rows(x) is x
    dst = torch.zeros_like(x)
    assert torch.equal(sel.scatter_(dst, rows)[mask], rows) and not dst[~mask].any()
    # (row, position) -> rows of a (B, H, N, dh) cache, in the order of a (T, H, dh) tensor
    assert sel.kv_index(2).tolist() == [0, 4, 2, 6, 11, 15]
    assert torch.equal(Positions.from_index(torch.tensor([[2, 0, 0], [3, 3, 3], [1, 1, 1]]), 4).mask()[:2], mask[:2])


def test_partial_step_matches_full_on_computed_positions():
    """Positions computed in a partial step see the same keys/values as in a full step."""
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator
    from diffaccel.contract.state import RunState

    pipe = tiny_text_pipeline("masked")
    den = pipe.denoiser
    x = torch.randint(4, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    run = RunState(adapter="text", num_steps=1, batch_size=2)
    with torch.no_grad():
        ctx = _RunContext(den, run)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        full = ctx.logits.clone()
        # change the inputs at some positions and recompute only those
        x2 = x.clone()
        x2[:, 3] = 5
        x2[:, 9] = 6
        mask = torch.zeros(2, 16, dtype=torch.bool)
        mask[:, [3, 9]] = True
        run.plan = StepPlan(positions=mask)
        pipe._denoise(ctx, _NoAccelerator(), x2, None)
        partial = ctx.logits
        ctx2 = _RunContext(den, RunState(adapter="text", num_steps=1, batch_size=2))
        pipe._denoise(ctx2, _NoAccelerator(), x2, None)
    # untouched positions keep their old logits; one layer deep the computed ones are exact
    assert torch.equal(partial[:, 0], full[:, 0])
    assert not torch.allclose(partial[:, 3], full[:, 3])


@pytest.mark.parametrize("batch", [1, 3])
def test_partial_step_is_exact_for_a_single_layer(batch):
    """Rows may compute different positions: each row's keys and values land in its own cache row."""
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator
    from diffaccel.contract.state import RunState

    pipe = tiny_text_pipeline("masked", n_layers=1)
    x = torch.randint(4, 64, (batch, 16), generator=torch.Generator().manual_seed(1))
    changed = [[5], [2, 11], [15]][:batch]
    with torch.no_grad():
        run = RunState(adapter="text", num_steps=1, batch_size=batch)
        ctx = _RunContext(pipe.denoiser, run)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        x2 = x.clone()
        mask = torch.zeros(batch, 16, dtype=torch.bool)
        for r, pos in enumerate(changed):
            x2[r, pos] = 7
            mask[r, pos] = True
        run.plan = StepPlan(positions=mask)
        pipe._denoise(ctx, _NoAccelerator(), x2, None)
        ref = _RunContext(pipe.denoiser, RunState(adapter="text", num_steps=1, batch_size=batch))
        pipe._denoise(ref, _NoAccelerator(), x2, None)
    # with one layer, a changed position's output depends only on its fresh K/V and the cached
    # (unchanged) others; the cache then holds the full step's keys and values in every row
    for r, pos in enumerate(changed):
        torch.testing.assert_close(ctx.logits[r, pos], ref.logits[r, pos], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ctx.kv[0].k, ref.kv[0].k, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ctx.kv[0].v, ref.kv[0].v, rtol=1e-5, atol=1e-6)


def test_rope_is_the_textbook_rotation():
    """The complex form turns each pair (x[2j], x[2j+1]) by pos * freq_j, as the real form does."""
    from diffaccel.adapters.text.sampling.model import apply_rope, rope_tables

    dh, M = 8, 5
    x = torch.randn(2, 3, M, dh, generator=torch.Generator().manual_seed(0))
    inv = 1.0 / (10000 ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    ang = torch.arange(M, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    want = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    torch.testing.assert_close(apply_rope(x, rope_tables(M, dh)), want, rtol=1e-5, atol=1e-6)


def test_modulation_cache_follows_condition_and_weights():
    """The denoiser computes a block's modulation once per condition vector, and again when the
    condition or the weights change (never a stale value)."""
    pipe = tiny_text_pipeline("masked")
    den, blk = pipe.denoiser, pipe.denoiser.model.blocks[0]
    h = torch.randn(1, 16, blk.qkv.in_features, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        c = den.condition(None, 1)
        assert den.condition(None, 1) is c  # same vector: the same tensor, so the cache serves it
        first = den._modulation(0, c)
        assert den._modulation(0, c) is first
        blk.mod.bias.add_(0.5)  # in place, as an optimiser step would
        fresh = den._modulation(0, c)
        assert fresh is not first
        torch.testing.assert_close(fresh[0], blk.modulation(c)[0])
        from diffaccel.adapters.text.sampling.model import KVCache
        torch.testing.assert_close(den.block(0, h, c, KVCache()), blk(h, c, KVCache()))
        other = den.condition(None, 2)  # another batch size: another vector
        assert other is not c and other.shape[0] == 2


def test_a_zero_condition_row_is_that_row_unconditioned():
    """A row whose external condition vector is all zeros gets no projection (not the projection's
    bias): that row is the unconditioned model, while the other rows keep their condition."""
    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM

    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, max_len=8, mask_id=2, cond_dim=4)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    v = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        both, plain = model(x, cond=v), model(x)
        assert not torch.allclose(both[0], plain[0]) and not torch.allclose(both[1], plain[1])
        one = model(x, cond=torch.stack([v[0], torch.zeros(4)]))
        torch.testing.assert_close(one[0], both[0])
        torch.testing.assert_close(one[1], plain[1])


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_strategy_can_stop_the_run_early(kind):
    """``run.stop`` set in post_step ends the run after that step; finalize still fills every position."""
    class StopAt:
        name = "stop-at"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            if run.step == 3:
                run.stop = True

    pipe = tiny_text_pipeline(kind)
    out = run_with(pipe, [StopAt()], length=16, steps=12, seed=0)
    assert out.report["steps_run"] == 4
    assert out.report["steps"] == 12
    assert out.tokens.shape == (1, 16)
    if kind == "masked":  # positions still masked at the stop are filled from the last logits
        assert (out.tokens != pipe.denoiser.mask_id).all()
    full = run_with(pipe, [], length=16, steps=12, seed=0)
    assert full.report["steps_run"] == 12


# ---- truncated logits (TopKLogits) ----------------------------------------------------------------

def _truncator(k, compact):
    from diffaccel.adapters.text.sampling.logits import TopKLogits

    class Truncate:
        name = "truncate"
        seen: list = []

        @hookimpl
        def diffaccel_denoiser_output(self, run, output):
            vals, idx = output.topk(k, dim=-1)
            if compact:
                return TopKLogits(vals, idx, output.shape[-1])
            return torch.full_like(output, -math.inf).scatter(-1, idx, vals)

        @hookimpl
        def diffaccel_post_step(self, run, output):
            self.seen.append((output.top1.clone(), output.top1_prob.clone(), output.topk is not None,
                              output.probs().clone()))

    return Truncate()


def test_samplers_take_topk_logits_like_their_dense_form():
    """A strategy may hand the sampler (values, indices): the masked sampler at temperature 0
    commits the same tokens as with the dense -inf form, and post_step sees the same top-1."""
    pipe = tiny_text_pipeline("masked")
    dense, compact = _truncator(5, False), _truncator(5, True)
    a = run_with(pipe, [dense], length=16, steps=8, seed=3, temperature=0.0)
    b = run_with(pipe, [compact], length=16, steps=8, seed=3, temperature=0.0)
    assert torch.equal(a.tokens, b.tokens)
    for (t1, p1, c1, q1), (t2, p2, c2, q2) in zip(dense.seen, compact.seen):
        assert not c1 and c2
        assert torch.equal(t1, t2) and torch.allclose(p1, p2, atol=1e-6) and torch.allclose(q1, q2, atol=1e-6)


def test_clean_estimate_and_draw_from_topk_logits():
    from diffaccel.adapters.text.sampling.logits import TopKLogits, clean_estimate, draw

    g = torch.Generator().manual_seed(0)
    logits, E = torch.randn(2, 5, 30, generator=g) * 3, torch.randn(30, 4, generator=g)
    vals, idx = logits.topk(6, dim=-1)
    tk = TopKLogits(vals, idx, 30)
    dense = tk.dense()
    assert torch.isinf(dense).sum() == 2 * 5 * 24 and torch.equal(dense.gather(-1, idx), vals)
    assert torch.allclose(clean_estimate(tk, E, 0.7), clean_estimate(dense, E, 0.7), atol=1e-5)
    assert torch.equal(tk.argmax(-1), logits.argmax(-1))
    banned = [int(idx[0, 0, 0])]  # ban row 0 position 0's top-1: the draw must avoid it
    conf, tok = draw(tk.rows(0, torch.arange(5)), banned, 0.0, g)
    conf_d, tok_d = draw(dense[0], banned, 0.0, g)
    assert torch.equal(tok, tok_d) and torch.allclose(conf, conf_d) and int(tok[0]) != banned[0]
    drawn = torch.stack([draw(tk.rows(1, torch.arange(5)), [], 1.0, g)[1] for _ in range(50)])
    assert bool((drawn.unsqueeze(-1) == idx[1]).any(-1).all())  # each position draws from its own kept tokens


def test_partial_step_refreshes_only_the_computed_clean_estimates():
    """Continuous samplers: after a partial step, the clean estimate is recomputed at the computed
    positions only, and equals the full recomputation (the other logits did not change)."""
    from types import SimpleNamespace

    from diffaccel.adapters.text.sampling.logits import clean_estimate
    from diffaccel.adapters.text.sampling.pipeline import _refresh_computed

    g = torch.Generator().manual_seed(0)
    logits, E = torch.randn(2, 6, 20, generator=g), torch.randn(20, 3, generator=g)
    prev = clean_estimate(logits, E, 0.7)
    idx = torch.tensor([[1, 4], [0, 5]])
    logits.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, 20), torch.randn(2, 2, 20, generator=g))
    sel = Positions.from_index(idx, 6)
    ctx = SimpleNamespace(head_sel=sel, logits=logits, step_logits=None)
    estimate = lambda lg: clean_estimate(lg, E, 0.7)  # noqa: E731
    got = _refresh_computed(ctx, logits, prev, estimate)
    assert torch.allclose(got, clean_estimate(logits, E, 0.7), atol=1e-6)
    assert torch.equal(got[0, 0], prev[0, 0])  # an uncomputed position keeps its estimate
    # the step's fresh rows, when the adapter kept them, serve instead of gathering them again
    ctx.step_logits = sel.gather(logits)
    assert torch.equal(_refresh_computed(ctx, logits, prev, estimate), got)
    ctx.step_logits = None
    replaced = logits.clone()  # a strategy replaced the logits: everything is recomputed
    assert torch.allclose(_refresh_computed(ctx, replaced, prev, estimate), clean_estimate(replaced, E, 0.7))


class NarrowLastLayer:
    """From step 1 the last layer runs on every other position (changing each step); the others
    keep their cached output. Checks, after every step, that the logits are the head of the last
    layer's outputs, and records how many rows the head ran on."""

    name = "narrow-last"

    def __init__(self, pipe):
        self.den = pipe.denoiser
        self.last = None
        self.checked = 0

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.index < run.info.n_layers - 1 or run.step == 0:
            return layer.compute(hidden)
        self.last = layer
        mask = torch.zeros(hidden.shape[:2], dtype=torch.bool)
        mask[:, run.step % 2::2] = True
        return layer.compute(hidden, positions=mask)

    @hookimpl
    def diffaccel_post_step(self, run, output):
        if self.last is not None:
            want = self.den.model.logits(self.last.cached_output)
            torch.testing.assert_close(output.logits, want, rtol=1e-5, atol=1e-5)
            self.checked += 1


def test_the_head_runs_only_where_the_last_layer_ran(monkeypatch):
    pipe = tiny_text_pipeline("masked")
    rows = []
    logits = pipe.denoiser.logits

    def counted(h):
        rows.append(h.shape[0] * h.shape[1] if h.dim() == 3 else h.shape[0])
        return logits(h)

    monkeypatch.setattr(pipe.denoiser, "logits", counted)
    spy = NarrowLastLayer(pipe)
    out = run_with(pipe, [spy], length=20, steps=10, seed=0)
    assert spy.checked == 9  # the logits equal the head of the last layer's outputs at every step
    assert rows == [20] + [10] * 9  # the first step in full, then the half the last layer ran on
    assert out.report["counters"]["fraction_computed"] < 1
    # a hook that returns something else than the layer's output gets the head everywhere
    rows.clear()
    copy = NarrowLastLayer(pipe)
    inner = copy.diffaccel_layer_output
    copy.diffaccel_layer_output = lambda run, layer, hidden: inner(run, layer, hidden).clone()
    copy.diffaccel_layer_output = hookimpl(copy.diffaccel_layer_output)
    run_with(pipe, [copy], length=20, steps=10, seed=0)
    assert rows == [20] * 10


class SometimesTop1(NarrowLastLayer):
    """Partial steps as NarrowLastLayer's; reads the step output's top-1 on every third step only
    and checks it against the top-1 of the whole logits; keeps the last unread output."""

    name = "sometimes-top1"

    def __init__(self, pipe):
        super().__init__(pipe)
        self.read = []
        self.kept = None

    @hookimpl
    def diffaccel_post_step(self, run, output):
        from diffaccel.adapters.text.sampling.logits import most_probable

        if run.step % 3:
            self.kept = output  # the last unread one
            return
        prob, top1 = most_probable(output.logits.float())
        assert torch.equal(output.top1, top1) and torch.equal(output.top1_prob, prob)
        self.read.append(run.step)


def test_the_top1_is_computed_only_when_read_and_right_after_unread_steps(monkeypatch):
    import diffaccel.adapters.text.sampling.pipeline as pl

    calls = []
    real = pl.most_probable
    monkeypatch.setattr(pl, "most_probable", lambda lg: calls.append(lg.shape) or real(lg))
    pipe = tiny_text_pipeline("masked")
    spy = SometimesTop1(pipe)
    out = run_with(pipe, [spy], length=20, steps=10, seed=0)
    assert spy.read == [0, 3, 6, 9] and len(calls) == 4
    # after unread steps the cached top-1 is stale: every read recomputes the whole sequence
    # (a partial refresh would run on the 10 positions the head ran on, and serve stale others)
    assert all(s[:2] == (1, 20) for s in calls)
    with pytest.raises(RuntimeError, match="during the post-step call"):
        spy.kept.top1  # read after its call: the adapter has moved on
    assert out.report["steps_run"] == 10
