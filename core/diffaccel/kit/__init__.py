"""What strategies share: words (``words``), saved conditions (``conditions``), extrapolation of
cached features (``extrapolate``), deliberate-change marks (``hygiene``) and small statistics
(``stats``). Imports only ``diffaccel.contract``; plugins may import it.
"""
