"""The ``masked`` sampler's loop (absorbing-state diffusion as in MDLM / LLaDA): each step predicts
every masked position, draws a token per position and commits the most confident ones, a fixed
number per step, optionally in semi-autoregressive blocks (``TextDiffusionPipeline`` runs it)."""

from __future__ import annotations

import math

import torch

from diffaccel.adapterkit import RunSequence

from .logits import CdfCache, TopKLogits, draw
from .outputs import CommitProposal, committed_blocks


def most_confident(candidates: torch.Tensor, confs: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """(B, N) bool: in each row r, the ``ks[r]`` candidates with the highest confidence (the
    low-confidence remasking schedule). One top-k over all rows; the per-row loop it replaced
    cost a few milliseconds a step at batch 8."""
    chosen = torch.zeros_like(candidates)
    kmax = max(ks, default=0)
    if kmax == 0:
        return chosen
    B = candidates.shape[0]
    top = confs.masked_fill(~candidates, -math.inf).topk(kmax, dim=1).indices  # best first
    keep = torch.arange(kmax, device=confs.device)[None, :] < torch.tensor(ks, device=confs.device)[:, None]
    rows = torch.arange(B, device=confs.device)[:, None].expand(-1, kmax)
    chosen[rows[keep], top[keep]] = True
    return chosen


def commit_most_confident_(x: torch.Tensor, candidates: torch.Tensor, confs: torch.Tensor, choices: torch.Tensor,
                           ks: list[int]) -> None:
    """In place: in each row r of ``x`` (B, N), the ``ks[r]`` candidates with the highest
    confidence take their drawn tokens."""
    chosen = most_confident(candidates, confs, ks)
    x[chosen] = choices[chosen]


def block_steps(steps: int, todo: list[int]) -> list[int]:
    """Steps per semi-autoregressive block, in proportion to the positions it has to fill
    (``todo``), largest remainders first and ties to the earlier block; a block with nothing to
    fill (the prompt's) gets none, every other block at least one while ``steps`` allow. Equal
    blocks get ``steps // nb`` each and one more for the first ``steps % nb``."""
    total = sum(todo)
    if total == 0:
        return [0] * len(todo)
    share = [steps * n / total for n in todo]
    out = [int(s) for s in share]
    order = sorted(range(len(todo)), key=lambda b: (-(share[b] - out[b]), b))
    for b in order[: steps - sum(out)]:
        out[b] += 1
    for b in (b for b in range(len(todo)) if todo[b] and not out[b]):  # a tiny block: one step from the largest
        richest = max(range(len(out)), key=lambda i: out[i])
        if out[richest] > 1:
            out[richest] -= 1
            out[b] = 1
    return out


def masked_loop(pipe, ctx, seq: RunSequence, x, fixed, steps, temperature, block_size, gens, bar, prefix_cache=False):
    """The masked sampler on ``x`` (B, N) in place (``fixed``: the prompt's and pinned positions); returns ``x``."""
    run = ctx.run
    B, N = x.shape
    mask_id = ctx.den.mask_id
    block_size = block_size or N
    nb = -(-N // block_size)
    block_of = (torch.arange(N, device=x.device) // block_size)[None, :].expand(B, N)
    # the most masked positions any row has in each block: a block of the prompt alone gets no step
    todo = torch.zeros(B, nb, dtype=torch.long, device=x.device).scatter_add_(1, block_of, (x == ctx.den.mask_id).long())
    per_block = block_steps(steps, todo.amax(0).tolist())
    # Each row walks the blocks on its own: it leaves a block when the block's steps are spent
    # or, when a strategy chooses commits, as soon as nothing in it is masked. Without such a
    # strategy every row commits on the same schedule, so the rows move in step.
    accel = seq.accel
    early = accel.active and accel.commits
    if prefix_cache and early:
        raise ValueError("prefix_cache does not combine with a strategy that commits tokens early: rows would "
                         "leave their blocks at different steps, and the prefix is one for the batch")
    blk, spent, shown = [0] * B, [0] * B, None
    banned = list(ctx.den.special_ids)
    cdfs = CdfCache((B, N, ctx.den.vocab_size), x.device) if accel.active and temperature > 0 else None
    for step in range(steps):
        masked = x == mask_id
        left = torch.zeros(B, nb, dtype=torch.long, device=x.device).scatter_add_(1, block_of, masked.long()).tolist()
        for r in range(B):
            while blk[r] < nb and (spent[r] >= per_block[blk[r]] or (early and not left[r][blk[r]])):
                blk[r], spent[r] = blk[r] + 1, 0
        if nb > 1 and blk != shown:  # a block committed: what serve streams (StreamsBlocks)
            shown = list(blk)
            run.info.set(committed=committed_blocks(x, mask_id, [min(b * block_size, N) for b in blk], pipe.tokenizer.decode))
        if early:
            if all(b == nb for b in blk):
                break
            done = torch.tensor([b == nb and not any(row) for b, row in zip(blk, left)], device=x.device)
            ctx.rows_done = done if bool(done.any()) else None
        if prefix_cache:  # without early commits every row is in the same block
            ctx.prefix_lo = min(blk[0], nb - 1) * block_size
        run.step = step
        run.timestep = float(masked.float().mean())  # the current mask rate
        t = torch.tensor(run.timestep * 1000.0, device=pipe.device) if ctx.den.time_conditioned else None
        logits = pipe._step_model(ctx, seq, x, t)
        cache = None
        if cdfs is not None:  # hooked run: rows the step did not compute keep their CDF
            if logits is ctx.logits:
                cdfs.invalidate(None if ctx.head_sel is None else ctx.head_sel.flat)
                cache = cdfs
            else:  # a strategy's replacement logits: every row may have changed
                cdfs.invalidate(None)
        candidates = masked & (block_of == torch.tensor(blk, device=x.device)[:, None])
        counts = candidates.sum(1).tolist()
        if cache is not None:
            confs, choices = cache.draw(logits, candidates, banned, temperature, gens, counts)
        else:
            confs = torch.zeros(B, N, device=x.device)
            choices = torch.zeros(B, N, dtype=torch.long, device=x.device)
            for r, n in enumerate(counts):
                if n:
                    cand = candidates[r].nonzero().squeeze(1)
                    rows = logits.rows(r, cand) if isinstance(logits, TopKLogits) else logits[r, cand]
                    confs[r, cand], choices[r, cand] = draw(rows, banned, temperature, gens[r])
        steps_left = [per_block[b] - j if b < nb else 0 for b, j in zip(blk, spent)]
        chosen = most_confident(candidates, confs, [math.ceil(n / s) if n else 0 for n, s in zip(counts, steps_left)])
        if early:
            computed = None if logits is not ctx.logits or ctx.head_sel is None else ctx.head_sel.mask()
            extra = seq.commit(lambda: CommitProposal(
                candidates=candidates, tokens=choices, confidence=confs, scheduled=chosen, logits=logits,
                computed=computed, temperature=temperature, steps_left=steps_left))
            if extra is not None:
                chosen = chosen | (extra.to(x.device) & candidates)
        x[chosen] = choices[chosen]
        spent = [j + 1 for j in spent]
        pipe._post(ctx, seq, x, logits, x == mask_id, fixed)
        bar.update(1)
        if seq.stopped:  # a strategy ended the run: finalize fills what is still masked
            return x
    return x
