"""``python -m diffaccel.cli`` (as before the move, e.g. under ``accelerate launch -m``): the same
as ``python -m diffaccel.cli.entry`` and the ``diffaccel`` script."""

import sys

from .entry import main

sys.exit(main())
