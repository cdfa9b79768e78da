# SPDX-License-Identifier: Apache-2.0
from models.qwen2.loader import Qwen2Loader

__all__ = ["Qwen2Loader"]
