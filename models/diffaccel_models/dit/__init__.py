"""The digits DiT's recipe and its commands (``diffaccel train dit-digits``, ``diffaccel dit-digits-accuracy``)."""
