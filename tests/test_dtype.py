"""``[model] dtype`` and ``device`` (issue 39): checked before anything loads, honoured by every
adapter and strategy in bfloat16 on the CPU (scripts/dtype_matrix.py), and the
hot-path hygiene watch (``diffaccel.kit.hygiene``), shown to fail a strategy that breaks its rules."""

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import diffaccel
from diffaccel import hookimpl
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ConfigError
from diffaccel.kit.hygiene import deliberate, watch
from diffaccel.runtime.placement import check_placement

def _script(name: str):
    """A module of scripts/ (not in the package), loaded once by file path."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


matrix = _script("dtype_matrix")

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'


def _check(tmp_path, capsys, extra: str) -> tuple[int, str]:
    path = tmp_path / "c.toml"
    path.write_text(MODEL + extra)
    rc = main(["check", str(path)])
    return rc, capsys.readouterr().err


def test_dtype_defaults_to_float32_and_takes_the_three_names(tmp_path):
    base = {"adapter": "text", "checkpoint": "wordnet-masked"}
    assert diffaccel.parse_config({"model": base}).model.dtype == "float32"
    for name in ("bfloat16", "float32"):
        assert diffaccel.parse_config({"model": {**base, "dtype": name}}).model.dtype == name


@pytest.mark.parametrize("extra, says", [
    ('dtype = "fp8"\n', "[model]: key 'dtype': must be one of 'float32', 'bfloat16', 'float16', got 'fp8'"),
    ('device = "gpu"\n', "[model]: key 'device': 'gpu' is not a torch device"),
    ('device = "meta"\n', "[model]: key 'device': 'meta' cannot run a model; allowed: cpu, cuda, cuda:N, mps, xpu"),
])
def test_bad_dtype_or_device_is_one_line_exit_2(tmp_path, capsys, extra, says):
    rc, err = _check(tmp_path, capsys, extra)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert says in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    from diffaccel.adapters.text import adapter as text_adapter

    def never(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(text_adapter, "load_pipeline", never)
    path = tmp_path / "c.toml"
    path.write_text(MODEL + 'device = "cuda"\ndtype = "bfloat16"\n')
    rc = main(["generate", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "[model]: key 'device': 'cuda' but CUDA is not available here" in err


def test_a_dtype_without_kernels_on_the_device_is_refused():
    """float16 on a CPU: refused where this torch lacks its kernels (an older torch had no
    float16 matmul on the CPU), which the probe finds; accepted where it has them."""
    def no_half(device, dtype):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')

    line = check_placement("cpu", "float16", probe=no_half)
    assert line == ("key 'dtype': 'float16' does not run on 'cpu' with this torch (\"addmm_impl_cpu_\" not implemented "
                    "for 'Half'); use dtype = \"float32\" or \"bfloat16\"")
    assert check_placement("cpu", "bfloat16") is None


def test_float16_runs_on_this_cpu_when_the_check_accepts_it():
    if check_placement("cpu", "float16") is not None:
        pytest.skip("this torch has no float16 kernels on the CPU: refused by the check (above)")
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "checkpoint": "wordnet-masked", "length": 8, "steps": 2,
                                            "dtype": "float16"}})
    pipe = diffaccel.load_pipeline(cfg)
    assert pipe.dtype == torch.float16
    out = diffaccel.runtime.adapters_registry.get_adapter("text").run(pipe, cfg, 0, progress=False)
    assert out.tokens.shape == (1, 8)


def test_apply_follows_the_pipeline_it_is_given():
    """A pipeline the user cast to bfloat16 after loading: the strategies' caches are made in its
    dtype (time-anchor's cache), whatever a config would say."""
    pipe = tiny_text_pipeline("masked", max_len=16).to(dtype=torch.bfloat16)
    assert pipe.dtype == torch.bfloat16
    seen = {}

    class Peek:
        name = "peek"

        @hookimpl
        def diffaccel_finalize(self, run, final):
            seen.update({b: st.cache.values.dtype for b, st in run.states("time-anchor").items() if st is not None})

    from diffaccel.runtime.adapters_registry import get_adapter

    cfg = diffaccel.parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "time-anchor", "warmup": 1}]})
    anchor = diffaccel.build_strategies(cfg, info=get_adapter("text").info(pipe))
    with diffaccel.apply(pipe, strategies=[*anchor, Peek()]) as p:
        p(length=16, steps=4, seed=0, progress=False)
    assert seen == {"main": torch.bfloat16}


# ---- the hygiene watch ---------------------------------------------------------------------------

class Sloppy:
    """Everything the watch must catch: a cache made without a device, an activation upcast."""

    name = "sloppy"

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self.scratch = torch.zeros(hidden.shape[0], hidden.shape[1])  # no device=
        self.kept = hidden.float()  # a float32 copy of a bfloat16 activation
        return None


class Careful:
    name = "careful"

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self.scratch = hidden.new_zeros(hidden.shape[:2])
        with deliberate("a test's reason"):
            self.kept = torch.zeros(3).float()
        return None


def _watched(strategy, dtype=torch.bfloat16):
    pipe = tiny_text_pipeline("masked", max_len=16).to(dtype=dtype)
    with watch([strategy], device="cpu", dtype=dtype, small=16) as seen:
        with diffaccel.apply(pipe, strategies=[strategy]) as p:
            p(length=16, steps=2, seed=0, progress=False)
    return seen


def test_the_watch_fails_a_strategy_that_allocates_on_the_host_or_upcasts():
    seen = _watched(Sloppy())
    assert seen.violations == [
        "sloppy.layer_output: torch.zeros(...) without device= (lands on the CPU when the model is on another device)",
        "sloppy.layer_output: aten._to_copy made a float32 tensor of (1, 16, 32) beside a bfloat16 model (an upcast)",
    ]


def test_the_watch_passes_a_careful_strategy_and_counts_its_declared_work():
    seen = _watched(Careful())
    assert seen.violations == [] and seen.deliberate["a test's reason"] > 0
    assert not hasattr(Careful, "diffaccel_layer_output.__wrapped__")  # the hooks are restored
    assert "diffaccel_layer_output" not in vars(Careful())


def test_float32_is_no_upcast_for_a_float32_model():
    assert _watched(Sloppy(), torch.float32).violations == [
        "sloppy.layer_output: torch.zeros(...) without device= (lands on the CPU when the model is on another device)"]


def test_the_watch_counts_host_syncs_in_a_step():
    class Syncs:
        name = "syncs"

        @hookimpl
        def diffaccel_layer_output(self, run, layer, hidden):
            if bool(hidden.isnan().any()):  # one host sync per layer call
                raise AssertionError
            return None

    seen = _watched(Syncs())
    assert seen.host_syncs == {"syncs.layer_output": 2 * 2}  # 2 layers x 2 steps


# ---- every adapter x every strategy, bfloat16 on the CPU ------------------------------------------

@pytest.fixture(scope="module")
def loaded():
    with tempfile.TemporaryDirectory() as tmp:
        yield matrix.Loaded("cpu", "bfloat16", matrix.tiny_folders(Path(tmp)))


@pytest.mark.parametrize("case", list(matrix.cases()), ids=lambda c: c.name)
def test_bfloat16_on_the_cpu(case, loaded):
    """Idle runs equal the unhooked model in bfloat16 (weights in bfloat16); each strategy runs,
    skips work and keeps the hot path clean (``dtype_matrix``)."""
    row = matrix.check(case, loaded)
    assert row["ok"], row["why"]


def test_the_matrix_covers_every_adapter_and_strategy():
    names = {c.name for c in matrix.cases()}
    for model in matrix.MODELS:
        assert f"{model}:idle" in names
    assert {n.split(":")[1] for n in names} == {"idle", "swd", "time-anchor", "topk", "parallel", "bert-cond", "dct-anchor"}
