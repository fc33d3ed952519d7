"""The public path of the text-model protocol (``diffaccel.adapters.text.families.protocol``, where
the model families import it from): ``import diffaccel.adapters.text.protocol`` gives that very module,
with no warning. Read its docstring for the protocol."""

import sys

from .families import protocol as _protocol

sys.modules[__name__] = _protocol
