# SPDX-License-Identifier: Apache-2.0
from models.qwen3.loader import Qwen3Loader, Qwen3MoeLoader

__all__ = ["Qwen3Loader", "Qwen3MoeLoader"]
