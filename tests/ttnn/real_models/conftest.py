# SPDX-License-Identifier: Apache-2.0
"""The real models' tests: one parameter per known model, each marked ``real_models(<name>)``.

The default suite runs the models ``requirements.txt`` installs (Gemma 3 270M, SmolLM2-135M). The
others (the Qwen2.5-Coder models, from ``requirements-real-models.txt``) run only when the marker
expression names ``real_models`` (``scripts/run_real_model_tests.sh`` installs them and runs
``pytest -m real_models``); elsewhere they are deselected, so a shared ``.venv`` that has them
installed does not slow the default suite down. A selected model whose packages are missing fails
with the command that installs them.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: everything reads local files

from models.demos.real_models.known import KNOWN_MODELS, KnownModel, known_model  # noqa: E402

DEFAULT_REQUIREMENTS = "requirements.txt"


def model_params(*, names: tuple[str, ...] | None = None, marks=()) -> list:
    """``pytest.param(model, id=name)`` for every known model (or ``names``), marked ``real_models(name)``."""
    return [pytest.param(KNOWN_MODELS[name], id=name, marks=(pytest.mark.real_models(name), *marks))
            for name in (names or KNOWN_MODELS)]


def is_default_model(model: KnownModel) -> bool:
    return model.requirements == DEFAULT_REQUIREMENTS


def is_larger_sibling(model: KnownModel) -> bool:
    """A model whose family a smaller known model already covers (Qwen2.5-Coder 1.5B beside 0.5B). CI runs one
    model per family, the smallest; the larger siblings' tests are ``slow`` and ``larger_sibling``, and run under
    ``scripts/run_real_model_tests.sh`` (which runs every real-model test)."""
    return any(other.family == model.family and other.size < model.size for other in KNOWN_MODELS.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of the models outside ``requirements.txt`` ``on_demand``, and deselects them
    unless ``-m`` names ``real_models``. This hook runs before ``-m`` selects, so CI's real-model
    suite can run ``-m "real_models and (on_demand or slow) and not larger_sibling"``: the tests the default
    suite did not, on one model per family."""
    on_demand = [item for item in items if (marker := item.get_closest_marker("real_models")) is not None
                 and marker.args and not is_default_model(known_model(marker.args[0]))]
    for item in on_demand:
        item.add_marker(pytest.mark.on_demand)
    for item in items:
        marker = item.get_closest_marker("real_models")
        if marker is not None and marker.args and is_larger_sibling(known_model(marker.args[0])):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.larger_sibling)
    if on_demand and "real_models" not in (config.option.markexpr or ""):
        config.hook.pytest_deselected(items=on_demand)
        dropped = set(on_demand)
        items[:] = [item for item in items if item not in dropped]


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread():
    """transformers' and the reference forward's float32 math on one torch thread. With the default
    pool (2 threads here) OpenMP workers spin at every op and lose their core to any other process:
    on this shared machine SmolLM2's three prompt forwards took 6-12 s that way and 1.1 s on one
    thread, its 48 cached decode steps 78 s and 6.5 s."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def scratch(tmp_path):
    """A directory for what a test builds (caches, converted checkpoints: gigabytes for the 1.5B
    model), deleted when the test ends, pass or fail: pytest would keep every test's tmp_path until
    the session ends, 20 GB across the real-model suite."""
    import shutil

    path = tmp_path / "scratch"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
