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
    extras_require={"ray": ["ray>=2.40"]},  # distributed seeding (models.seeding.ray_seed)
    entry_points={"console_scripts": ["tt-cache=models.common.cli:main"]},
)
