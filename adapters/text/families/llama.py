"""LLaMA/Qwen2-class decoders run as masked diffusion LMs (LLaDA, Dream).

LLaDA and Dream are LLaMA- and Qwen2-shaped decoders trained with a mask token and run with
bidirectional attention. ``LlamaDenoiser`` drives transformers' own ``LlamaForCausalLM`` /
``Qwen2ForCausalLM`` modules (their weights and submodules: ``embed_tokens``, each layer's
``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``, ``mlp``, the
final ``norm``, ``lm_head`` and the model's rotary embedding) layer by layer, WITHOUT a causal
mask, so that the pipeline can compute a ragged subset of positions per step with the other
positions' keys and values cached, exactly as the reference model does.

Checkpoints (a folder with ``config.json`` and safetensors, one file or shards with an index):

* ``model_type`` ``llama`` or ``qwen2``: the standard transformers layout, loaded as is.
* ``model_type`` ``Dream`` (Dream-v0): Qwen2 names and fields; read with ``Qwen2Config``.
* ``model_type`` ``llada`` (LLaDA-8B, ``block_type = "llama"``): OLMo-style names and fields,
  mapped onto ``LlamaForCausalLM`` by ``LLADA_NAMES`` / ``llada_config``::

      model.transformer.wte.weight                  -> model.embed_tokens.weight
      model.transformer.blocks.N.attn_norm.weight   -> model.layers.N.input_layernorm.weight
      model.transformer.blocks.N.q_proj / k_proj / v_proj
                                                    -> model.layers.N.self_attn.q_proj / k_proj / v_proj
      model.transformer.blocks.N.attn_out           -> model.layers.N.self_attn.o_proj
      model.transformer.blocks.N.ff_norm.weight     -> model.layers.N.post_attention_layernorm.weight
      model.transformer.blocks.N.ff_proj            -> model.layers.N.mlp.gate_proj   (the SiLU branch)
      model.transformer.blocks.N.up_proj            -> model.layers.N.mlp.up_proj     (the linear branch)
      model.transformer.blocks.N.ff_out             -> model.layers.N.mlp.down_proj
      model.transformer.ln_f.weight                 -> model.norm.weight
      model.transformer.ff_out.weight               -> lm_head.weight (absent with weight_tying: wte)

  LLaDA's block computes ``ff_out(act(ff_proj(x)) * up_proj(x))`` with ``act`` SiLU, which is
  ``LlamaMLP``'s ``down(silu(gate(x)) * up(x))``; its RMS norms and rotary embedding
  (rotate-half, ``rope_theta``) are LLaMA's. Config fields: ``d_model`` -> ``hidden_size``,
  ``n_layers``, ``n_heads``, ``n_kv_heads``, ``mlp_hidden_size`` -> ``intermediate_size``,
  ``embedding_size`` (or ``vocab_size``) -> ``vocab_size``, ``max_sequence_length`` ->
  ``max_position_embeddings``, ``weight_tying`` -> ``tie_word_embeddings``, ``include_qkv_bias``
  -> Qwen2-style q/k/v biases. Variants this mapping does not cover (another ``block_type``
  such as the fused ``att_proj`` sequential block, biases everywhere, ALiBi, q/k norms, scaled
  logits...) are refused with one line naming the ``config.json`` key.

The mask token id comes from ``config.json``'s ``mask_token_id`` (Dream-v0: 151666); LLaDA's
documented id, 126336, is the default for ``model_type = "llada"`` configs that lack the key.
Dream reads the logits of position p from position p - 1 (its head kept the autoregressive
shift of the Qwen2.5 model it started from; its sampler shifts the logits right by one, position
0 keeping its own): ``logit_shift = 1``, applied by the pipeline on full and partial steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from diffaccel.contract.errors import ModelLoadError

from ...checkpoints import check_vocab, folder_weights, match_state, read_tensors
from ..loading.loader import Loaded, ModelFacts, Source
from ..sampling.model import KVCache, attend_positions
from ..sampling.positions import Positions
from ..sampling.tokenizer import HFTokenizer

#: LLaDA's ``<|mdm_mask|>`` id (ML-GSAI/LLaDA: generate.py and the checkpoints' config.json).
LLADA_MASK_ID = 126336

#: model_type (lower case) -> transformers family it is run as.
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "dream": "qwen2", "llada": "llama"}

#: LLaDA weight name patterns -> transformers LLaMA names (see the module docstring).
LLADA_NAMES = [
    (r"model\.transformer\.wte\.weight", "model.embed_tokens.weight"),
    (r"model\.transformer\.ln_f\.weight", "model.norm.weight"),
    (r"model\.transformer\.ff_out\.weight", "lm_head.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.([qkv])_proj\.(weight|bias)", r"model.layers.\1.self_attn.\2_proj.\3"),
    (r"model\.transformer\.blocks\.(\d+)\.attn_out\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_proj\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.up_proj\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_out\.weight", r"model.layers.\1.mlp.down_proj.weight"),
]
_LLADA_RES = [(re.compile(p + "$"), r) for p, r in LLADA_NAMES]


def llada_name(name: str) -> str | None:
    """The transformers LLaMA name of a LLaDA weight, or None if the mapping has none."""
    for pat, rep in _LLADA_RES:
        if pat.match(name):
            return pat.sub(rep, name)
    return None


class LlamaDenoiser:
    """A transformers LLaMA/Qwen2 causal-LM module run bidirectionally as a masked denoiser."""

    kind = "masked"
    time_conditioned = False
    cond_dim = 0
    num_timesteps = 1000

    def __init__(self, model, mask_id: int, special_ids: set[int], max_len: int | None = None, logit_shift: int = 0):
        """``model``: a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` (``.model.layers``, ``.lm_head``).
        ``logit_shift`` 1: position p's logits are read from position p - 1's hidden state (and
        position 0's from its own), as Dream's sampler reads them; the pipeline applies it."""
        if logit_shift not in (0, 1):
            raise ValueError(f"logit_shift must be 0 or 1, got {logit_shift}")
        self.logit_shift = logit_shift
        cfg = model.config
        base = model.model
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported (config.json key 'use_sliding_window')")
        self.model = model.eval()
        self.base = base
        self.layers = base.layers
        self.n_layers = len(self.layers)
        self.vocab_size = cfg.vocab_size
        self.mask_id = mask_id
        self.special_ids = set(special_ids) | {mask_id}
        self.max_len = max_len or cfg.max_position_embeddings
        att = self.layers[0].self_attn
        self.head_dim = att.head_dim
        self.scale = att.scaling
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _rope(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n', head_dim) of positions 0..n'-1 (n' >= n) from the model's own rotary
        embedding (so its rope scaling applies), computed once and grown on demand."""
        if self._cos is None or self._cos.shape[0] < n or self._cos.device != torch.device(device):
            pos = torch.arange(n, device=device)[None]
            probe = torch.empty(0, device=device, dtype=self.base.embed_tokens.weight.dtype)
            cos, sin = self.base.rotary_emb(probe, pos)
            self._cos, self._sin = cos[0], sin[0]
        return self._cos, self._sin

    def condition(self, t, batch: int, cond=None):
        return None

    def embed(self, x, positions: Positions | None = None):
        if positions is not None:
            x = x.reshape(-1).index_select(0, positions.flat)
        return self.base.embed_tokens(x)

    def block(self, i: int, h, c, kv: KVCache, positions: Positions | None = None):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # seconds to import: deferred to a load

        layer = self.layers[i]
        att = layer.self_attn
        lead, dh = h.shape[:-1], self.head_dim  # (B, N), or (T,) with positions
        x = layer.input_layernorm(h)
        q = att.q_proj(x).view(*lead, -1, dh)
        k = att.k_proj(x).view(*lead, -1, dh)
        v = att.v_proj(x).view(*lead, -1, dh)
        if positions is None:
            cos, sin = self._rope(h.shape[1], h.device)
            n = h.shape[1]
            # (B, N, H, dh) with cos (N, dh) unsqueezed at 1: every row turned by its position
            q, k = apply_rotary_pos_emb(q, k, cos[:n], sin[:n], unsqueeze_dim=1)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            kv.k, kv.v = k, v
            # no mask, no is_causal: every position attends to every position (bidirectional)
            a = F.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1])
            a = a.transpose(1, 2).reshape(*lead, -1)
        else:
            cos, sin = self._rope(positions.N, h.device)
            # the computed subset keeps its own positions: (T, H, dh) with cos (T, dh)
            q, k = apply_rotary_pos_emb(q, k, cos.index_select(0, positions.pos), sin.index_select(0, positions.pos),
                                        unsqueeze_dim=1)
            a = attend_positions(q, k, v, kv, positions, scale=self.scale)
        h = h + att.o_proj(a)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h):
        return self.model.lm_head(self.base.norm(h))


# ---- configs --------------------------------------------------------------------------------

def _refuse(path, key: str, value, allowed: str):
    raise ModelLoadError(f"{path}: key '{key}' is {value!r}; supported: {allowed}")


def llada_config(cfg: dict, where) -> dict:
    """transformers LLaMA/Qwen2 config fields from a LLaDA ``config.json`` (refusing what the
    weight mapping does not cover, one line naming the key)."""
    checks = [("block_type", "llama", "'llama' (LLaDALlamaBlock)"), ("layer_norm_type", "rms", "'rms'"),
              ("activation_type", "silu", "'silu'"), ("alibi", False, "false"), ("rope", True, "true"),
              ("attention_layer_norm", False, "false"), ("input_emb_norm", False, "false"),
              ("scale_logits", False, "false"), ("include_bias", False, "false"),
              ("bias_for_layer_norm", False, "false"), ("layer_norm_with_affine", True, "true"),
              ("block_group_size", 1, "1")]
    for key, want, allowed in checks:
        value = cfg.get(key, want)
        if value != want and not (value is None and key == "bias_for_layer_norm"):
            _refuse(where, key, value, allowed)
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden_size"):
        if key not in cfg:
            raise ModelLoadError(f"{where}: missing key '{key}' (a LLaDA config needs d_model, n_layers, n_heads, mlp_hidden_size)")
    return {
        "hidden_size": cfg["d_model"], "num_hidden_layers": cfg["n_layers"], "num_attention_heads": cfg["n_heads"],
        "num_key_value_heads": cfg.get("n_kv_heads") or cfg["n_heads"], "intermediate_size": cfg["mlp_hidden_size"],
        "vocab_size": cfg.get("embedding_size") or cfg["vocab_size"], "rms_norm_eps": cfg.get("rms_norm_eps", 1e-5),
        "rope_theta": cfg.get("rope_theta", 10000.0), "max_position_embeddings": cfg.get("max_sequence_length", 4096),
        "tie_word_embeddings": bool(cfg.get("weight_tying", False)), "hidden_act": "silu",
    }


def hf_config(cfg: dict, where):
    """(transformers config, family) of a decoder ``config.json``."""
    from transformers import LlamaConfig, Qwen2Config  # seconds to import: deferred to a load

    mtype = str(cfg.get("model_type", "")).lower()
    family = FAMILIES[mtype]
    if mtype == "llada":
        fields = llada_config(cfg, where)
        if cfg.get("include_qkv_bias"):
            family = "qwen2"  # q/k/v biases, none on o_proj: Qwen2's attention
    else:
        for key in ("q_norm", "k_norm", "qk_norm"):
            if cfg.get(key):
                _refuse(where, key, cfg[key], "false (no q/k norms in LLaMA/Qwen2 attention)")
        skip = {"model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype"}
        fields = {k: v for k, v in cfg.items() if k not in skip}
    cls = LlamaConfig if family == "llama" else Qwen2Config
    try:
        conf = cls(**fields)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: not a valid {family} config ({exc})") from None
    if cfg.get("use_sliding_window"):
        _refuse(where, "use_sliding_window", cfg["use_sliding_window"], "false (full attention over every position)")
    return conf, family


def build_model(conf, family: str, device="meta"):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM  # seconds to import: deferred to a load

    cls = LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM
    with torch.device(device):
        return cls(conf)


# ---- weights --------------------------------------------------------------------------------

def read_safetensors(path: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder: ``model.safetensors`` or the shards its
    ``model.safetensors.index.json`` lists; a pickled ``pytorch_model.bin`` (or ``*.pt``) only with
    ``allow_pickle`` (``diffaccel.adapters.checkpoints``)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: not a valid shard index (needs a 'weight_map' object: {exc})") from None
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        _, pickles = folder_weights(path)
        if not pickles:
            raise ModelLoadError(f"{path}: no model.safetensors (nor model.safetensors.index.json); only safetensors weights are read")
        files = [p.name for p in pickles]
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if not (path / f).is_file():
            raise ModelLoadError(f"{path / f}: missing (listed in model.safetensors.index.json)")
        state.update(read_tensors(path / f, allow_pickle))
    return state


def map_state(state: dict[str, torch.Tensor], mtype: str, where) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's tensors into the transformers LLaMA/Qwen2 layout."""
    if mtype != "llada":
        return state
    out = {}
    for name, t in state.items():
        new = llada_name(name)
        if new is None:
            raise ModelLoadError(f"{where}: weight '{name}' has no LLaMA equivalent in the LLaDA mapping (see docs/text-models.md)")
        out[new] = t
    return out


def load_weights(model, state: dict[str, torch.Tensor], conf, where) -> None:
    """Assign ``state`` (float32) to the meta-device ``model``; tie the head when the config says
    so; rebuild the non-persistent rotary tables on the CPU. (The loading dispatch checks the
    weights are finite.)"""
    state = {k: v.float() for k, v in state.items()}
    if conf.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if conf.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    match_state(expected, {k: tuple(v.shape) for k, v in state.items()}, where)
    if conf.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if conf.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(conf)


def is_decoder_config(cfg: dict) -> bool:
    return str(cfg.get("model_type", "")).lower() in FAMILIES


def refuse_unsupported_decoder(cfg: dict, where) -> None:
    """A causal-LM architecture other than LLaMA/Qwen2: one line (before the BERT-family loader,
    which would fail on it less clearly)."""
    archs = cfg.get("architectures") or []
    if any(str(a).endswith("ForCausalLM") for a in archs):
        raise ModelLoadError(f"{where}: key 'model_type' is {cfg.get('model_type')!r}; supported decoders: "
                             f"{', '.join(sorted(set(FAMILIES)))} (and BERT-family masked LMs)")


def mask_id_of(cfg: dict, where) -> int:
    mid = cfg.get("mask_token_id")
    if mid is None and str(cfg.get("model_type", "")).lower() == "llada":
        mid = LLADA_MASK_ID
    if mid is None:
        raise ModelLoadError(f"{where}: missing key 'mask_token_id' (a masked diffusion LM names its mask token there; "
                             f"a causal LM such as plain LLaMA/Qwen2 has none)")
    if not isinstance(mid, int) or mid < 0:
        raise ModelLoadError(f"{where}: key 'mask_token_id' must be a token id, got {mid!r}")
    return mid


def load_decoder(path: Path, name: str | None = None, allow_pickle: bool = False) -> Loaded:
    """The denoiser and tokenizer of a LLaMA/Qwen2/Dream/LLaDA checkpoint folder."""
    where = path / "config.json"
    cfg = json.loads(where.read_text())
    mid = mask_id_of(cfg, where)
    conf, family = hf_config(cfg, where)
    if mid >= conf.vocab_size:
        raise ModelLoadError(f"{where}: key 'mask_token_id' is {mid}, beyond the vocabulary ({conf.vocab_size} tokens)")
    tok = _tokenizer(path)  # before the weights: a wrong tokenizer costs no load
    check_vocab(tok.tok.vocab_size, conf.vocab_size, path, exact=False, with_added=len(tok.tok))
    model = build_model(conf, family)
    single = path / "model.safetensors"
    weights = single if single.is_file() else path
    load_weights(model, map_state(read_safetensors(path, allow_pickle), str(cfg.get("model_type", "")).lower(), path), conf,
                 weights)
    tok.mask_id = mid
    special = set(tok.special_ids) | {mid}
    tok.special_ids = special
    # Dream keeps its autoregressive initialisation's head: the token at p is predicted at p - 1
    shift = 1 if str(cfg.get("model_type", "")).lower() == "dream" else 0
    return Loaded(denoiser=LlamaDenoiser(model, mid, special, logit_shift=shift), tokenizer=tok, name=name or path.name,
                  weights=model, where=weights)


def _tokenizer(path: Path) -> HFTokenizer:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # seconds to import: deferred to a load

    try:
        return HFTokenizer(AutoTokenizer.from_pretrained(str(path)))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    if (path / "tokenizer.json").is_file():  # remote-code tokenizers (Dream, LLaDA) ship one too
        return HFTokenizer(PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json")))
    raise ModelLoadError(f"{path}: no tokenizer transformers can load (tokenizer.json or tokenizer_config.json)")


class DecoderLoader:
    """LLaMA/Qwen2-class masked DLMs (config.json ``model_type`` in ``FAMILIES``): a local folder,
    or a hub id whose files are fetched (safetensors, and pickles only with ``allow_pickle``)."""

    names = ()

    def recognises(self, source: Source) -> bool:
        return is_decoder_config(source.config())

    def load(self, source: Source) -> Loaded:
        if source.path is not None:
            return load_decoder(source.path, allow_pickle=source.allow_pickle)
        from huggingface_hub import snapshot_download  # only a hub id needs the hub client

        pickles = ["*.bin", "*.pt"] if source.allow_pickle else []  # read with torch.load(weights_only=True) only
        folder = snapshot_download(source.checkpoint, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", *pickles])
        return load_decoder(Path(folder), name=source.checkpoint.split("/")[-1], allow_pickle=source.allow_pickle)

    def facts(self, source: Source) -> ModelFacts:
        conf, _ = hf_config(source.config(), source.where)
        return ModelFacts("masked", conf.vocab_size, conf.num_hidden_layers, conf.max_position_embeddings)


LOADER = DecoderLoader()

__all__ = ["LLADA_MASK_ID", "LLADA_NAMES", "LOADER", "LlamaDenoiser", "is_decoder_config", "llada_name", "load_decoder",
           "refuse_unsupported_decoder"]
