# SPDX-License-Identifier: Apache-2.0
"""The conversion ``prepare`` used before recipe 1 went through the ``gguf`` package: transformers'
GGUF loader with every weight dequantized, copied into a model without quantization settings,
``save_pretrained``. About 90 s here. Kept as the reference the fast conversion must equal byte for
byte (``test_prepare_gemma3``) and as the baseline of ``scripts/bench_prepare.py``.

    python -m models.demos.gemma3_270m.transformers_recipe GGUF_PATH OUT_DIR
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
    tokenizer = transformers.GemmaTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert_with_transformers(Path(sys.argv[1]), Path(sys.argv[2]))
