# SPDX-License-Identifier: Apache-2.0
"""The small Llama shape the seeding tests use (``llama-2k`` of :mod:`models.testing.model_shapes`):
hidden 2048, GQA 32/8 heads, MLP 5632, vocab 32000 (untied), 250 MiB of embedding and LM head plus
86 MiB per layer, so 4 layers make 0.6 GB, 16 make 1.6 GB and 27 make 2.5 GB; one ``model.safetensors``."""

from __future__ import annotations

import sys
from pathlib import Path

from models.testing.model_shapes import make_shaped_checkpoint

LAYERS_FOR_GB = {0.6: 4, 1.6: 16, 2.5: 27}


def make_llama_shaped(directory: Path, layers: int) -> Path:
    """Write (once) a llama-shaped checkpoint of ``layers`` layers into ``directory``."""
    return make_shaped_checkpoint(directory, "llama-2k", layers, shard_bytes=None)


def make_in_child(directory: Path, layers: int) -> Path:
    """:func:`make_llama_shaped` in a child process (its pages stay out of the caller's peak RSS)."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    subprocess.run([sys.executable, "-m", "models.testing.llama_shaped", str(directory), str(layers)],
                   cwd=repo, env=env, check=True, capture_output=True)
    return directory


if __name__ == "__main__":
    print(make_llama_shaped(Path(sys.argv[1]), int(sys.argv[2])))
