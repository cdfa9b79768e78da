# SPDX-License-Identifier: Apache-2.0
"""Resynthesis training on the prefill cache: ``python -m models.demos.resynthesis``."""
