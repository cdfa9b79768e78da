# SPDX-License-Identifier: Apache-2.0
"""Gemma 3 270M: the real model, prepared once into a Hugging Face checkpoint (see ``prepare``)."""
