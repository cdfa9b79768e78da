# SPDX-License-Identifier: Apache-2.0
from setuptools import find_packages, setup

setup(
    name="tt-warm-loaders",
    version="0.1.0",
    description="Warm-start model loading for Tenstorrent hardware: a verified ttnn weight cache and a durable prefill cache",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["models", "models.*"]),
    package_data={"models.common": ["mock_clusters/*.yaml"]},
    install_requires=["ttnn", "torch", "safetensors", "loguru", "blake3", "numpy"],
    extras_require={
        "ray": ["ray>=2.40"],  # distributed seeding (models.seeding.ray_seed)
        "vllm": ["vllm==0.33.0"],  # scripts/setup_vllm_env.sh builds its own environment
    },
    entry_points={
        "console_scripts": ["tt-cache=models.tt_cache.cli:main"],
        # Inert without vllm: models.vllm_plugin imports vllm only when vllm is installed.
        "vllm.platform_plugins": ["tt_host = models.vllm_plugin:register"],
        "vllm.general_plugins": ["tt_models = models.vllm_plugin:register_models"],
    },
)
