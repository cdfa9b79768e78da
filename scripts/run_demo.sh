#!/usr/bin/env bash
# Set up the environment if needed, then run the main job: Gemma 3 270M, prepared once, cold build,
# warm build, verify, completion from the warm cache (extra arguments pass through, see --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "${TT_VENV:-$root/.venv}/bin/python" -m models.demos.gemma3_270m.demo "$@"
