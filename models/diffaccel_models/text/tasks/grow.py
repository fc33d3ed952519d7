"""A task model started from another task's weights (``diffaccel train task --init FOLDER``).

The ``ledger`` model starts from ``arith``'s: it writes ``arith``'s equations, so the arithmetic
need not be learned again, only the look-up of a fact in a long prompt. The two models differ in
vocabulary, positions and depth, so the weights are carried over by meaning:

* token rows (embedding and output head) by the token's string; a token the source lacks keeps
  its fresh initialisation;
* learned positions: the source's rows for the positions it has, fresh ones after them;
* blocks: the source's blocks go to the new model's blocks ``layers`` (in order); the others keep
  their fresh initialisation, whose zero-initialised gates make them the identity at the start,
  so the grown model computes exactly what the source did on the source's positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from diffaccel.adapters.text.sampling.model import TextDiffusionLM


def _vocab(folder: Path) -> dict[str, int]:
    return json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]


def grow_from(model: TextDiffusionLM, tok, init: str | Path, layers: list[int] | None = None) -> dict[str, int]:
    """Copy ``init``'s weights into ``model`` (tokenizer ``tok``) as the module docstring says.
    Returns counts of what was carried over; a shape that cannot be carried raises ValueError
    naming the parameter."""
    src_dir = Path(init)
    src = TextDiffusionLM.load(src_dir)
    if src.config.dim != model.config.dim:
        raise ValueError(f"--init {src_dir}: width {src.config.dim}, the new model's is {model.config.dim}")
    n_src, n_new = src.config.n_layers, model.config.n_layers
    layers = list(range(n_src)) if layers is None else layers
    if len(layers) != n_src or sorted(set(layers)) != sorted(layers) or not all(0 <= i < n_new for i in layers):
        raise ValueError(f"--init-layers {layers}: name {n_src} distinct blocks of the new model's 0..{n_new - 1}")
    src_vocab, new_vocab = _vocab(src_dir), tok.tok.get_vocab()
    pairs = [(new_vocab[w], i) for w, i in src_vocab.items() if w in new_vocab]
    new_ids, src_ids = (torch.tensor(x) for x in zip(*pairs))
    with torch.no_grad():
        model.tok_emb.weight[new_ids] = src.tok_emb.weight[src_ids]
        model.head.weight[new_ids] = src.head.weight[src_ids]
        model.head.bias[new_ids] = src.head.bias[src_ids]
        n_pos = min(src.config.max_len, model.config.max_len)
        model.pos_emb[:n_pos] = src.pos_emb[:n_pos]
        model.cond_bias.copy_(src.cond_bias)
        model.ln_f.load_state_dict(src.ln_f.state_dict())
        for s, d in enumerate(layers):
            model.blocks[d].load_state_dict(src.blocks[s].state_dict())
    return {"tokens": len(pairs), "positions": n_pos, "blocks": n_src}
