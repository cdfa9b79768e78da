# SPDX-License-Identifier: Apache-2.0
from models.phi3.loader import Phi3Loader

__all__ = ["Phi3Loader"]
