"""The task models' recipe (``train``) and growing a trained model deeper (``grow``); the tasks themselves
(problems, parsing, scoring) are inference code: ``diffaccel.adapters.text.tasks``."""
