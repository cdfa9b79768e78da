# SPDX-License-Identifier: Apache-2.0
from models.llama.loader import LlamaLoader

__all__ = ["LlamaLoader"]
