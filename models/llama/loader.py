# SPDX-License-Identifier: Apache-2.0
"""Llama (1/2/3.x): the reference decoder; GQA and llama3 RoPE scaling live in the config."""

from __future__ import annotations

from models.common.decoder import DecoderLoader


class LlamaLoader(DecoderLoader):
    family = "llama"
