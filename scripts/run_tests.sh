#!/usr/bin/env bash
# Set up the environment if needed, then run the default test suite (extra pytest arguments pass through).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "${TT_VENV:-$root/.venv}/bin/python" -m pytest "$@"
