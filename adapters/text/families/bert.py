"""transformers masked LMs (a local folder or a hub id) of the families in ``FAMILIES``, loaded
with ``AutoModelForMaskedLM.from_pretrained`` and run by the family's denoiser. The catch-all
loader: any config.json no other loader recognises comes here; a causal LM this adapter cannot
run (``llama.refuse_unsupported_decoder``) and a family not in ``FAMILIES`` are refused in one
line, by ``load`` and ``facts`` alike, before any weight is read."""

from __future__ import annotations

from pathlib import Path

from diffaccel.contract.errors import ModelLoadError

from ...checkpoints import check_loading_info, check_vocab, precheck_folder, quiet_loading
from ..sampling.denoisers import BertDenoiser
from .deberta import DebertaV2Denoiser
from .encoders import AlbertDenoiser, DistilBertDenoiser
from .llama import refuse_unsupported_decoder
from ..loading.loader import Loaded, ModelFacts, Source, first_line
from ..sampling.tokenizer import HFTokenizer


FAMILIES: dict[str, type] = {
    "bert": BertDenoiser, "roberta": BertDenoiser, "xlm-roberta": BertDenoiser, "electra": BertDenoiser,
    "distilbert": DistilBertDenoiser, "albert": AlbertDenoiser, "deberta-v2": DebertaV2Denoiser,
}
"""config.json ``model_type`` -> the denoiser that runs it (each checked against transformers'
own forward in tests/test_text_families.py). A denoiser class may say why it ``refuses`` a
variant of its family (``refuses(config) -> str | None``), checked by ``load`` and ``facts``."""

GUIDE = "docs/writing-an-adapter.md"


def family_of(source: Source) -> type:
    """The denoiser class of ``source``'s masked-LM family; one ``ModelLoadError`` naming the
    families that run (and where to read how to add one) for any other."""
    model_type = source.config().get("model_type")
    if model_type not in FAMILIES:
        runs = set(FAMILIES) | set(source.families)  # the other kinds' families (ModernBERT's, a third party's) too
        raise ModelLoadError(f"checkpoint '{source.checkpoint}': model_type {model_type!r} is not a masked-LM family "
                             f"the text adapter runs (it runs: {', '.join(sorted(runs))}); another family needs a "
                             f"text model kind of its own ({GUIDE})")
    problem = getattr(FAMILIES[model_type], "refuses", lambda config: None)(source.config())
    if problem:  # a variant of the family the denoiser cannot run
        raise ModelLoadError(f"checkpoint '{source.checkpoint}': {model_type}: {problem}")
    return FAMILIES[model_type]


def load_hf_masked_lm(source: Source) -> Loaded:
    from transformers import AutoModelForMaskedLM, AutoTokenizer  # seconds to import: deferred to a load

    name_or_path, local = source.checkpoint, source.path is not None
    safe = precheck_folder(Path(name_or_path), source.allow_pickle) if local else True
    try:
        # hub ids: safetensors only unless allowed; transformers reads a pickle with weights_only=True
        with quiet_loading():
            model, info = AutoModelForMaskedLM.from_pretrained(
                name_or_path, use_safetensors=True if safe and not source.allow_pickle else None,
                output_loading_info=True, ignore_mismatched_sizes=True)
            tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"checkpoint '{name_or_path}': not a shipped model ({', '.join(source.known)}), not a local model folder, "
            f"and transformers could not load it ({first_line(exc)})"
        ) from None
    if tok.mask_token_id is None:
        raise ModelLoadError(f"checkpoint '{name_or_path}': its tokenizer has no mask token; a masked LM is needed")
    where = Path(name_or_path) if local else name_or_path
    check_loading_info(info, where)
    check_vocab(tok.vocab_size, model.get_input_embeddings().num_embeddings, where, exact=False, with_added=len(tok))
    try:
        den = family_of(source)(model, tok.mask_token_id, set(tok.all_special_ids))
    except TypeError as exc:
        raise ModelLoadError(f"checkpoint '{name_or_path}': {exc}") from None
    return Loaded(denoiser=den, tokenizer=HFTokenizer(tok), name=source.name, weights=model, where=where,
                  model_kind=source.config().get("model_type"))


class BertLoader:
    """Any transformers masked LM; the last loader asked."""

    names = ()

    def recognises(self, source: Source) -> bool:
        return True

    def load(self, source: Source) -> Loaded:
        refuse_unsupported_decoder(source.config(), source.where)
        family_of(source)
        return load_hf_masked_lm(source)

    def facts(self, source: Source) -> ModelFacts:
        from transformers import AutoConfig  # seconds to import: deferred to a read

        refuse_unsupported_decoder(source.config(), source.where)
        family = family_of(source)
        try:
            conf = AutoConfig.from_pretrained(source.checkpoint)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"checkpoint '{source.checkpoint}': transformers could not read its config ({first_line(exc)})") from None
        layers = family.layers_in(conf) if hasattr(family, "layers_in") else conf.num_hidden_layers
        return ModelFacts("masked", conf.vocab_size, layers, conf.max_position_embeddings)


LOADER = BertLoader()
