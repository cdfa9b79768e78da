# SPDX-License-Identifier: Apache-2.0
from models.gemma.loader import Gemma3Loader

__all__ = ["Gemma3Loader"]
