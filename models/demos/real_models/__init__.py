# SPDX-License-Identifier: Apache-2.0
"""Real models from PyPI GGUF wheels (Gemma 3 270M, SmolLM2-135M, Qwen2.5-Coder 0.5B / 1.5B): the
table of known models (``known``), one prepare for all of them (``prepare.prepare_model``) and the
main job (``demo``). Importing this package imports nothing heavy."""
