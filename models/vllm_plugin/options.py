# SPDX-License-Identifier: Apache-2.0
"""The plugin's options in vLLM's ``additional_config``, in one table.

Two spellings, the same keys: flat (``additional_config={"precision": "bfloat8_b"}``) and under
``"tt"`` (``additional_config={"tt": {"precision": "bfloat8_b"}}``, the Tenstorrent plugin's form,
so one config serves both). A key given both ways must agree; an unknown key under ``"tt"`` is
refused by name (flat, the dict is vLLM's and other plugins' too, so unknown keys are theirs).
Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TT_SECTION = "tt"

# key: (what it sets, its default)
OPTIONS: dict[str, tuple[str, Any]] = {
    "precision": ("weight precision: a dtype (bfloat16, bfloat8_b, bfloat4_b), a precision policy (performance, "
                  "accuracy) or a policy file (.json) (default: optimizations' policy)", None),
    "checkpoint": ("the weights to serve under vLLM's model (a path or hub id; default: that model)", None),
    "n_layers": ("build only the first N decoder layers (tests, bring-up)", None),
    "optimizations": ("tt-metal's optimizations: the precision policy performance or accuracy", "performance"),
}


class OptionsError(ValueError):
    """An ``additional_config`` the plugin cannot take: the message names the key."""


def plugin_options(additional_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every option of :data:`OPTIONS`, from the flat keys and the ``"tt"`` section, defaults filled in."""
    config = dict(additional_config or {})
    section = config.get(TT_SECTION, {})
    if not isinstance(section, Mapping):
        raise OptionsError(f'additional_config["{TT_SECTION}"] must be a dict of plugin options, got '
                           f"{type(section).__name__}")
    unknown = sorted(set(section) - set(OPTIONS))
    if unknown:
        raise OptionsError(f'additional_config["{TT_SECTION}"]: unknown option(s) {", ".join(map(repr, unknown))}; '
                           f"known: {', '.join(OPTIONS)}")
    options = {}
    for key, (_, default) in OPTIONS.items():
        flat, nested = config.get(key), section.get(key)
        if flat is not None and nested is not None and flat != nested:
            raise OptionsError(f'additional_config["{key}"]={flat!r} and additional_config["{TT_SECTION}"]["{key}"]='
                               f"{nested!r} disagree; give one")
        value = nested if nested is not None else flat
        options[key] = default if value is None else value
    return options
