"""A text model kind from outside: folders whose config.json has ``"model_type": "tiny-kind"``
(and ``seed``, ``n_layers``, ``max_len``) hold a small random reference denoiser, built from the
seed. Uses the public loader protocol (``diffaccel.adapters.text.loading.loader``) only."""

from diffaccel.adapters.text.loading.loader import Loaded, ModelFacts, Source
from diffaccel.contract.errors import ModelLoadError


class TinyKind:
    names = ()

    def recognises(self, source: Source) -> bool:
        return source.path is not None and source.config().get("model_type") == "tiny-kind"

    def _keys(self, source: Source) -> dict:
        cfg = source.config()
        if not isinstance(cfg.get("n_layers"), int) or cfg["n_layers"] < 1:
            raise ModelLoadError(f"{source.where}: key 'n_layers': {cfg.get('n_layers')!r} is not a positive integer")
        return {"seed": cfg.get("seed", 0), "n_layers": cfg["n_layers"], "max_len": cfg.get("max_len", 32)}

    def load(self, source: Source) -> Loaded:
        from diffaccel.adapters.text.testing import tiny_text_pipeline

        pipe = tiny_text_pipeline("masked", **self._keys(source))
        return Loaded(denoiser=pipe.denoiser, tokenizer=pipe.tokenizer, name=source.name, weights=pipe.denoiser.model,
                      where=source.path)

    def facts(self, source: Source) -> ModelFacts:
        keys = self._keys(source)
        return ModelFacts("masked", 64, keys["n_layers"], keys["max_len"])


LOADER = TinyKind()
