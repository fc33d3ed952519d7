"""What strategies share: words (``words``), saved conditions (``conditions``), extrapolation of
cached features (``extrapolate``), deliberate-change marks (``hygiene``), small statistics
(``stats``) and the cost gate of caches that skip part of a step (``paygate``). Imports only
``diffaccel.contract``; plugins may import it.
"""
