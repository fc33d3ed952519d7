"""Damaged and unsafe checkpoints (issue 27), on tiny random models saved into tmp_path with
``save_pretrained`` / ``save_file``: every adapter and text loader (reference model, BERT-family,
LLaMA-class, DiffusionGemma, UNet) refuses each case with one line naming the file, and the
CLI exits 2 before any step. A pickle's code-executing payload never runs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from diffaccel.cli.entry import main
from diffaccel.contract.errors import ModelLoadError

KINDS = ["reference", "bert", "llama", "gemma", "unet"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", *[f"w{i}" for i in range(33)]]


# ---- tiny checkpoints -------------------------------------------------------------------------

def _hf_tokenizer(vocab=VOCAB):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def _reference(path: Path) -> Path:
    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer

    tok = TextTokenizer(train_tokenizer(["a small dog barks", "a big cat sleeps"] * 20, vocab_size=60))
    torch.manual_seed(0)
    TextDiffusionLM(TextDiffusionConfig(vocab_size=tok.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=16,
                                        mask_id=tok.mask_id)).save(path)
    tok.save(path / "tokenizer.json")
    return path


def _bert(path: Path) -> Path:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    _hf_tokenizer().save_pretrained(path)
    return path


def _llama(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)).save_pretrained(path)
    _hf_tokenizer().save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "mask_token_id": 4}))
    return path


def _gemma(path: Path) -> Path:
    from diffaccel.adapters.text.families.diffusion_gemma.build import build

    return build(path, "tiny", seed=0)


def _unet(path: Path) -> Path:
    from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline

    tiny_digits_pipeline().save_pretrained(path)
    return path


BUILD = {"reference": _reference, "bert": _bert, "llama": _llama, "gemma": _gemma, "unet": _unet}
#: the file holding the weights the test damages, and its pickled twin's name
WEIGHTS = {"reference": ("model.safetensors", "model.bin"), "bert": ("model.safetensors", "pytorch_model.bin"),
           "llama": ("model.safetensors", "pytorch_model.bin"), "gemma": ("model.safetensors", "pytorch_model.bin"),
           "unet": ("unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.bin")}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One saved checkpoint per kind, built once; each test damages its own copy."""
    root = tmp_path_factory.mktemp("pristine")
    return {k: BUILD[k](root / k) for k in KINDS}


@pytest.fixture
def copy_of(pristine, tmp_path):
    import shutil

    def make(kind: str) -> Path:
        return Path(shutil.copytree(pristine[kind], tmp_path / kind))
    return make


def load(kind: str, path: Path, allow_pickle: bool = False):
    if kind == "unet":
        from diffaccel.adapters.diffusers.unet.adapter import load_checkpoint

        return load_checkpoint(str(path), allow_pickle)
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    return load_pipeline(str(path), allow_pickle)


def refused(kind: str, path: Path, allow_pickle: bool = False) -> str:
    with pytest.raises(ModelLoadError) as info:
        load(kind, path, allow_pickle)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def _state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _to_pickle(kind: str, path: Path) -> Path:
    """Replace the safetensors weights with the same tensors pickled by torch.save."""
    safe, pick = (path / f for f in WEIGHTS[kind])
    torch.save(_state(safe), pick)
    safe.unlink()
    return pick


# ---- the cases ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_intact_checkpoint_loads(kind, pristine):
    assert load(kind, pristine[kind]) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_safetensors_is_one_line(kind, copy_of):
    path = copy_of(kind)
    f = path / WEIGHTS[kind][0]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    msg = refused(kind, path)
    assert str(f) in msg and "truncated or corrupted" in msg


@pytest.mark.parametrize("kind", KINDS)
def test_corrupted_header_is_one_line(kind, copy_of):
    path = copy_of(kind)
    f = path / WEIGHTS[kind][0]
    data = bytearray(f.read_bytes())
    data[8:16] = b"\x00garbage"  # inside the JSON header
    f.write_bytes(bytes(data))
    assert str(f) in refused(kind, path)


@pytest.mark.parametrize("kind", KINDS)
def test_pickle_refused_without_the_option_and_loaded_with_it(kind, copy_of):
    path = copy_of(kind)
    pick = _to_pickle(kind, path)
    msg = refused(kind, path)
    assert str(pick) in msg and "allow_pickle = true" in msg
    assert load(kind, path, allow_pickle=True) is not None


class _Payload:
    """Unpickling this calls ``exec``, which writes the marker file: a code-executing pickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("container", ["torch.save", "raw pickle"])
def test_code_executing_pickle_never_runs(kind, allow, container, copy_of, tmp_path):
    path = copy_of(kind)
    pick = _to_pickle(kind, path)
    marker = tmp_path / "marker"
    state = {"weight": torch.zeros(2), "payload": _Payload(marker)}
    if container == "torch.save":
        torch.save(state, pick)
    else:
        pick.write_bytes(pickle.dumps(state))
    msg = refused(kind, path, allow_pickle=allow)
    assert not marker.exists()
    assert str(pick) in msg and ("weights_only" in msg if allow else "allow_pickle = true" in msg)


@pytest.mark.parametrize("container", ["torch.save", "raw pickle"])
def test_the_payload_is_live(container, tmp_path):
    """Control for the test above: an unrestricted unpickler does run the payload."""
    marker, pick = tmp_path / "marker", tmp_path / "evil.bin"
    state = {"weight": torch.zeros(2), "payload": _Payload(marker)}
    if container == "torch.save":
        torch.save(state, pick)
        torch.load(pick, weights_only=False)
    else:
        pick.write_bytes(pickle.dumps(state))
        pickle.loads(pick.read_bytes())
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("kind", KINDS)
def test_nan_and_inf_weights_name_the_tensor(kind, copy_of):
    from safetensors.torch import save_file

    for bad in (float("nan"), float("inf")):
        path = copy_of(kind)
        f = path / WEIGHTS[kind][0]
        state = _state(f)
        name = sorted(k for k, v in state.items() if v.is_floating_point() and v.numel() > 4)[1]
        state[name] = state[name].clone()
        state[name].view(-1)[3] = bad
        save_file(state, str(f), metadata={"format": "pt"})
        msg = refused(kind, path)
        assert ("NaN" if bad != bad else "inf") in msg
        # transformers names a tensor by its module path, which may differ in the prefix from the file's
        assert ".".join(name.split(".")[-3:]) in msg
        import shutil

        shutil.rmtree(path)


@pytest.mark.parametrize("kind", ["reference", "llama"])
def test_missing_tensor_and_wrong_shape(kind, copy_of):
    from safetensors.torch import save_file

    path = copy_of(kind)
    f = path / "model.safetensors"
    state = _state(f)
    gone = sorted(state)[0]
    save_file({k: v for k, v in state.items() if k != gone}, str(f))
    msg = refused(kind, path)
    assert str(f) in msg and f"missing tensor '{gone}'" in msg
    wide = sorted(k for k, v in state.items() if v.dim() == 2)[0]
    state[wide] = torch.zeros(state[wide].shape[0], state[wide].shape[1] + 1)
    save_file(state, str(f))
    msg = refused(kind, path)
    assert str(f) in msg and f"tensor '{wide}' has shape" in msg


@pytest.mark.parametrize("kind", ["bert", "gemma", "unet"])
def test_missing_tensor_in_a_library_loaded_checkpoint(kind, copy_of):
    """transformers and diffusers would initialise a missing tensor at random: refused instead."""
    from safetensors.torch import save_file

    path = copy_of(kind)
    f = path / WEIGHTS[kind][0]
    state = _state(f)
    gone = sorted(k for k in state if "layer" in k or "down_blocks" in k)[0]
    save_file({k: v for k, v in state.items() if k != gone}, str(f), metadata={"format": "pt"})
    msg = refused(kind, path)
    assert gone.split(".")[-2] in msg and "missing" in msg


@pytest.mark.parametrize("kind", ["reference", "bert", "llama", "gemma"])
def test_tokenizer_of_another_size_is_refused(kind, copy_of):
    path = copy_of(kind)
    if kind == "reference":
        from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer

        TextTokenizer(train_tokenizer(["one two three four five six"] * 10 + ["seven eight"], vocab_size=40)).save(path / "tokenizer.json")
    else:
        for f in path.glob("tokenizer*"):
            f.unlink()
        _hf_tokenizer([*VOCAB, *[f"extra{i}" for i in range(5000 if kind == "gemma" else 40)]]).save_pretrained(path)
    msg = refused(kind, path)
    assert "tokenizer has" in msg and "embedding table" in msg


def test_allow_pickle_is_validated_at_config_time(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\nallow_pickle = "yes"\n')
    assert main(["check", str(cfg)]) == 2


@pytest.mark.parametrize("kind", ["bert", "unet"])
def test_cli_pickle_and_truncation_exit_2_in_one_line(kind, copy_of, capsys, tmp_path):
    path = copy_of(kind)
    _to_pickle(kind, path)
    cfg = tmp_path / "c.toml"
    adapter = "unet" if kind == "unet" else "text"
    extra = 'steps = 2\nprompts = ["digit 1"]\nbatch = 1\n' if kind == "unet" else "length = 8\nsteps = 2\n"
    cfg.write_text(f'[model]\nadapter = "{adapter}"\ncheckpoint = "{path}"\n{extra}')
    out = tmp_path / ("o.png" if kind == "unet" else "o.txt")  # --out is checked before the load
    assert main(["generate", str(cfg), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "allow_pickle = true" in err
