"""Reading checkpoints and data from disk: the model kinds' ``Loader`` protocol and ``Source`` (``loader``),
GGUF files (``gguf``), diffaccel's reference checkpoints (``reference``) and the WordNet corpus
(``corpus``). The dispatch over the kinds' loaders is ``diffaccel.adapters.text.families.dispatch``:
its names resolve here too, as they did from the old module ``diffaccel.adapters.text.loading``,
with a DeprecationWarning until 0.3."""

from diffaccel.adapterkit import old_names

__getattr__ = old_names("diffaccel.adapters.text.loading", "diffaccel.adapters.text.families.dispatch")
