# SPDX-License-Identifier: Apache-2.0
"""Mistral: the Llama layout; every layer attends within the config's ``sliding_window``.

Nothing converts differently: the window is an attention-mask fact, read from ``config.json``
into :attr:`ModelArgs.layer_types` / :attr:`ModelArgs.sliding_window` (kept with the cache, so a
warm build knows it too).
"""

from __future__ import annotations

from models.common.decoder import DecoderLoader


class MistralLoader(DecoderLoader):
    family = "mistral"
