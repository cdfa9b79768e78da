#!/usr/bin/env bash
# Set up the vLLM environment if needed, then run the vLLM tests in it (extra pytest arguments pass through).
# They need the prepared Gemma 3 270M (prepared on first use, about a minute; TT_MODEL_DATA to share one).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_vllm_env.sh"
cd "$root"
exec "${TT_VLLM_VENV:-$root/.venv-vllm}/bin/python" -m pytest tests/ttnn/vllm "$@"
