#!/usr/bin/env bash
# Create (or refresh) the light environment: requirements-light.txt and the project (--no-deps), no
# torch, no ttnn. Enough for tt-cache seed --check, ls, check, verify, gc, clean and prefill: what
# a CI job that only reads a cache runs (.github/workflows/warm-cache.yaml, the validate job).
# Building a cache (tt-cache build, seed without --check) needs the full environment (setup_env.sh).
#
# TT_VENV names the venv (default .venv-light). uv installs when it is on PATH (or TT_UV names it),
# else pip (installs uv first when it can: as in setup_env.sh); TT_INSTALLER=pip forces pip.
# Returns at once when requirements-light.txt and setup.py are unchanged since the last run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${TT_VENV:-$root/.venv-light}"
stamp="$venv/.setup-stamp"
want=$(cat "$root/requirements-light.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)
installer="${TT_INSTALLER:-auto}"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/tt-cache" ]; then
  exit 0
fi
case "$installer" in
  auto|uv|pip) ;;
  *) echo "setup_light_env: TT_INSTALLER must be auto, uv or pip, not '$installer'" >&2; exit 2 ;;
esac

source "$root/scripts/find_python312.sh"
py=$(find_python312) || { echo "setup_light_env: Python 3.12 is required; set PYTHON312=/path/to/python3.12" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py" -m venv --without-pip "$venv"

uv="${TT_UV:-$(command -v uv || true)}"
uv_install() {
  [ -n "$uv" ] || return 1
  "$uv" pip install --quiet --python "$venv/bin/python" -r "$root/requirements-light.txt" &&
    "$uv" pip install --quiet --python "$venv/bin/python" --no-deps -e "$root"
}
pip_install() {
  local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "$venv/bin/python" -m pip --version >/dev/null 2>&1 || "$venv/bin/python" -m ensurepip --upgrade >/dev/null
  "${pip[@]}" -r "$root/requirements-light.txt" && "${pip[@]}" --no-deps -e "$root"
}

case "$installer" in
  uv) uv_install || { echo "setup_light_env: uv failed or is missing (TT_INSTALLER=uv: no fallback)" >&2; exit 1; } ;;
  pip) pip_install || { echo "setup_light_env: pip failed" >&2; exit 1; } ;;
  auto) uv_install || pip_install || { echo "setup_light_env: installing failed" >&2; exit 1; } ;;
esac
echo "$want" > "$stamp"
echo "setup_light_env: ready ($venv)" >&2
