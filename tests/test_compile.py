"""torch.compile and diffaccel (issue 39, docs/compile.md): blocks compiled in place keep every
strategy working with the same outputs; a denoiser compiled as a whole is refused in one line.

The tests compile with the ``eager`` backend: TorchDynamo's graph capture, guards and graph
breaks, what decides whether the hooks still run and what they see, without the minutes of C++
code generation inductor spends on a CPU (what compile gains is a timing question, for a bench)."""

import pytest
import torch

import diffaccel
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_sd_pipeline
from diffaccel.conformance import same_output
from diffaccel.contract.errors import DiffaccelError


def _text(pipe, strategies):
    with diffaccel.apply(pipe, strategies=strategies) as p:
        return p(length=16, steps=6, seed=0, progress=False, batch=2)


def test_text_blocks_compiled_in_place_keep_strategies_and_outputs():
    pipe = tiny_text_pipeline("masked", max_len=16)
    swd = [{"use": "swd", "tau": 0.01, "K": 1}]
    plain, skipped = _text(pipe, []), _text(pipe, swd)
    torch._dynamo.reset()
    for block in pipe.denoiser.model.blocks:
        block.compile(backend="eager")
    compiled_plain, compiled_skipped = _text(pipe, []), _text(pipe, swd)
    assert same_output(plain, compiled_plain) and same_output(skipped, compiled_skipped)
    assert compiled_skipped.report["counters"]["fraction_computed"] < 1.0  # swd still skips positions


def _images(pipe, strategies):
    with diffaccel.apply(pipe, strategies=strategies) as p:
        return p("a red cube", num_inference_steps=6, generator=torch.Generator().manual_seed(0), output_type="pt",
                 return_dict=False)[0]


def test_unet_blocks_compiled_in_place_keep_strategies_and_outputs():
    pipe = tiny_sd_pipeline()
    dct = [{"use": "dct-anchor", "threshold": 0.9, "warmup": 1}]
    before = _images(pipe, dct)
    torch._dynamo.reset()
    for block in [*pipe.unet.down_blocks, pipe.unet.mid_block, *pipe.unet.up_blocks]:
        block.compile(backend="eager")
    assert torch.equal(before, _images(pipe, dct))


def test_a_denoiser_compiled_as_a_whole_is_refused_in_one_line():
    pipe = tiny_sd_pipeline()
    pipe.unet = torch.compile(pipe.unet, backend="eager")
    with pytest.raises(DiffaccelError) as err:
        _images(pipe, [{"use": "dct-anchor"}])
    assert str(err.value) == ("pipe.unet is torch.compile'd as a whole; diffaccel routes its blocks through the strategies: "
                              "compile the blocks in place instead (block.compile() for each block, docs/compile.md), "
                              "or apply diffaccel to the uncompiled pipeline")
