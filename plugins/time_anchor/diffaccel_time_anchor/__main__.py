"""Deprecated until diffaccel 0.3: ``diffaccel time-anchor-calibrate`` and ``time-anchor-clusters``."""

import sys

from .cli import main

sys.exit(main())
