#!/usr/bin/env bash
# Create (or refresh) the project's Python 3.12 virtual environment in .venv.
# ttnn publishes wheels for CPython 3.10 and 3.12 only. On a ready environment this returns at once:
# a stamp holds the hash of requirements.txt and setup.py, and a change to either re-runs pip.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${TT_VENV:-$root/.venv}"
stamp="$venv/.setup-stamp"
want=$(cat "$root/requirements.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import ttnn" >/dev/null 2>&1; then
  exit 0
fi

source "$root/scripts/find_python312.sh"

py=$(find_python312) || { echo "setup_env: Python 3.12 is required (ttnn has no wheel for this Python); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
echo "setup_env: building $venv with $py (first run takes a few minutes: torch and ttnn are large)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements.txt"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$root"
echo "$want" > "$stamp"
echo "setup_env: ready ($venv)" >&2
