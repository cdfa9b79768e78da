# SPDX-License-Identifier: Apache-2.0
"""transformers' own conversion of a GGUF: its GGUF loader with every weight dequantized, copied into a
model without quantization settings, ``save_pretrained``, and ``AutoTokenizer``'s tokenizer saved.

``prepare`` must write these files byte for byte (the slow test in ``tests/ttnn/real_models``), and
``scripts/bench_prepare.py`` times it as the baseline. 30 s (SmolLM2) to 90 s (Qwen2.5-Coder 1.5B,
8 GB peak RSS) here, one thread.

    python -m models.demos.real_models.transformers_recipe GGUF_PATH OUT_DIR
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path


def convert_with_transformers(gguf_path: Path, out_dir: Path) -> None:
    """Write config, generation config, weights and tokenizer of ``gguf_path`` into ``out_dir``."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    import transformers

    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name,
        quantization_config=transformers.GgufConfig(dequantize=True), dtype=torch.bfloat16)
    config = copy.deepcopy(gguf_model.config)
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    config.dtype = torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    model.save_pretrained(out_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert_with_transformers(Path(sys.argv[1]), Path(sys.argv[2]))
