# Sourced by the environment set-up scripts: find_python312 prints a Python 3.12 interpreter
# (ttnn 0.81.1 has wheels for CPython 3.10 and 3.12 only; 3.12 is what both environments use).
# PYTHON312=/path/to/python3.12 names one outright.
find_python312() {
  local candidate
  for candidate in "${PYTHON312:-}" python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
                   "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}
