"""The text models' recipes: the WordNet LMs (``training``), the task models (``tasks``), their commands."""
