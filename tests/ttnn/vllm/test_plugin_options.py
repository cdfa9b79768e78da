# SPDX-License-Identifier: Apache-2.0
"""The plugin's ``additional_config`` options, flat or under ``"tt"`` (no vLLM needed: runs everywhere;
the vLLM suite's engines pass theirs under ``"tt"``, the checkpoint-override test flat)."""

from __future__ import annotations

import pytest

from models.vllm_plugin.options import OPTIONS, OptionsError, plugin_options


def test_flat_and_tt_section_spellings_give_the_same_options():
    flat = plugin_options({"precision": "bfloat8_b", "n_layers": 2, "some_other_plugin": 1})
    nested = plugin_options({"tt": {"precision": "bfloat8_b", "n_layers": 2}, "some_other_plugin": 1})
    assert flat == nested == {"precision": "bfloat8_b", "checkpoint": None, "n_layers": 2,
                              "optimizations": "performance"}
    assert plugin_options(None) == {key: default for key, (_, default) in OPTIONS.items()}
    assert plugin_options({"precision": "bfloat16", "tt": {"precision": "bfloat16"}})["precision"] == "bfloat16"


@pytest.mark.parametrize("config, named", [
    ({"tt": {"precison": "bfloat16"}}, "'precison'"),
    ({"tt": ["precision"]}, 'additional_config["tt"] must be a dict'),
    ({"precision": "bfloat16", "tt": {"precision": "bfloat8_b"}}, 'additional_config["precision"]=\'bfloat16\''),
])
def test_an_unknown_or_contradicting_option_is_refused_by_name(config, named):
    with pytest.raises(OptionsError) as error:
        plugin_options(config)
    assert named in str(error.value)
