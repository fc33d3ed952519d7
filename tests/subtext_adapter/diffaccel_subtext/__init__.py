"""Adapters that accept the text adapter's pipelines: ``SubText`` derives from ``TextAdapter``,
``SubSub`` from ``SubText``; ``Sibling`` copies ``TextAdapter``'s members without deriving from it."""

from diffaccel.adapters.text.adapter import TextAdapter


class SubText(TextAdapter):
    name = "subtext"


class SubSub(SubText):
    name = "subsub"


Sibling = type("Sibling", (), {k: v for k, v in vars(TextAdapter).items() if not k.startswith("__")} | {"name": "sibling"})
