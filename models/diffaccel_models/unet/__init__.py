"""The digits UNet's recipe and its commands (``diffaccel train digits``, ``diffaccel digits-accuracy``)."""
