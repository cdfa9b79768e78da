# SPDX-License-Identifier: Apache-2.0
from models.gemma.gemma4 import Gemma4Loader
from models.gemma.loader import Gemma3Loader

__all__ = ["Gemma3Loader", "Gemma4Loader"]
