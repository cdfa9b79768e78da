# SPDX-License-Identifier: Apache-2.0
from models.mistral.loader import MistralLoader

__all__ = ["MistralLoader"]
