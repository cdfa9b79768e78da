# SPDX-License-Identifier: Apache-2.0
"""Without vLLM the plugin does nothing and nothing imports vLLM.

Collected in both environments: in the default one vLLM is really absent; in the vLLM one the
child processes below hide it (an import hook that refuses ``vllm``), so both cases are real."""

from __future__ import annotations

import json
import subprocess
import sys

from models.testing import REPO_ROOT

HIDE_VLLM = """
import importlib.abc, sys
class _NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _NoVllm())
import importlib.util
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] == "vllm" else _find_spec(name, *a)
"""


def run_without_vllm(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", HIDE_VLLM + code], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_points_do_nothing_without_vllm():
    result = run_without_vllm("""
import json, sys
import models.vllm_plugin as plugin
print(json.dumps({"platform": plugin.register(), "models": plugin.register_models(),
                  "vllm": any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)}))
""")
    assert result == {"platform": None, "models": None, "vllm": False}


def test_installed_entry_points_resolve_to_the_inert_functions():
    result = run_without_vllm("""
import json
from importlib.metadata import entry_points
found = {group: [(ep.name, ep.value, ep.load()()) for ep in entry_points(group=group) if ep.value.startswith("models.")]
         for group in ("vllm.platform_plugins", "vllm.general_plugins")}
print(json.dumps(found))
""")
    assert result == {"vllm.platform_plugins": [["tt_host", "models.vllm_plugin:register", None]],
                      "vllm.general_plugins": [["tt_models", "models.vllm_plugin:register_models", None]]}


def test_default_suite_collects_no_vllm_test_and_imports_no_vllm():
    result = run_without_vllm("""
import io, json, sys, contextlib
import pytest
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/ttnn/vllm"])
ids = [line for line in out.getvalue().splitlines() if "::" in line]
print(json.dumps({"code": int(code), "files": sorted({i.split("::")[0] for i in ids}),
                  "vllm": any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)}))
""")
    everywhere = ["test_paged_attention.py", "test_plugin_inert.py", "test_plugin_options.py", "test_readback.py",
                  "test_tt_models.py"]
    assert result == {"code": 0, "files": [f"tests/ttnn/vllm/{name}" for name in everywhere], "vllm": False}


def test_the_architecture_list_is_the_family_table_and_imports_nothing_heavy():
    """The plugin's registration data comes from models.registry alone: no torch, ttnn or vllm."""
    proc = subprocess.run([sys.executable, "-c", """
import json, sys
from models.registry import ARCHITECTURES, FAMILIES
from models.vllm_plugin.architectures import tt_class_path
paths = {arch: tt_class_path(arch) for arch in ARCHITECTURES}
heavy = sorted({m.split('.')[0] for m in sys.modules} & {"torch", "ttnn", "vllm", "transformers"})
print(json.dumps({"paths": paths, "families": sorted({f.name for f in FAMILIES}), "heavy": heavy}))
"""], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["families"] == ["gemma3", "gemma4", "llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe"]
    assert result["paths"]["Qwen2ForCausalLM"] == "models.vllm_plugin.tt_models:TTQwen2ForCausalLM"
    assert {p.split(":")[1] for p in result["paths"].values()} >= {
        "TTQwen2ForCausalLM", "TTMistralForCausalLM", "TTPhi3ForCausalLM", "TTLlamaForCausalLM"}
