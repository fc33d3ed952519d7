"""The training command runs end to end on a tiny corpus and writes what the README promises."""

import json

import pytest

from diffaccel.adapters.text.loading import load_pipeline
from diffaccel.adapters.text.train import TrainConfig, pack, token_weights, train

LINES = [f"word{i % 7}: a small thing that does {i % 5} things" for i in range(300)]


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_train_writes_a_loadable_checkpoint(tmp_path, kind):
    out = train(TrainConfig(kind=kind, out=str(tmp_path / kind), steps=4, batch=4, seq_len=32, dim=16, layers=1,
                            heads=2, vocab=80, checkpoint_every=2, threads=1, freq_weight=0.5), lines=list(LINES))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "curves.png", "train.json"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "train.json").read_text())
    assert meta["steps_done"] == 4
    pipe = load_pipeline(str(out))
    assert pipe.kind == kind
    assert len(pipe(length=16, steps=4, progress=False).texts) == 1


def test_pack_starts_at_lines():
    stream, starts = pack([[5, 6], [7], [8, 9, 10]], sep_id=3)
    assert stream.tolist() == [5, 6, 3, 7, 3, 8, 9, 10, 3]
    assert starts.tolist() == [0, 3, 5]


def test_frequency_weights_favour_rare_tokens():
    import numpy as np

    w = token_weights(np.array([4, 4, 4, 4, 5]), vocab=6, alpha=0.5)
    assert w[5] > w[4]
