#!/usr/bin/env bash
# vLLM's OpenAI server (`vllm serve`) for a prepared real model from the warm ttnn cache, as a user runs it:
# HF_HUB_OFFLINE=1, the model id, the prepared hub cache. Sets up .venv-vllm and prepares the model if needed.
#   scripts/run_vllm_serve.sh [MODEL] [vllm serve arguments...]    MODEL: gemma3-270m (default), smollm2-135m, ...
# Listens on 127.0.0.1:8000 unless --host/--port say otherwise; Ctrl-C (SIGINT) or SIGTERM stops it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=gemma3-270m
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then model=$1; shift; fi
bash "$root/scripts/setup_vllm_env.sh"
py="${TT_VLLM_VENV:-$root/.venv-vllm}/bin/python"
cd "$root"
snapshot=$("$py" -m models.demos.real_models.prepare "$model" 2>/dev/null | tail -n 1)
[ -d "$snapshot" ] || { echo "run_vllm_serve: preparing $model failed; run: $py -m models.demos.real_models.prepare $model" >&2; exit 1; }
repo_id=$("$py" -c "import json, sys; print(json.load(open(sys.argv[1]))['repo_id'])" "$snapshot/.prepared.json")
export HF_HUB_OFFLINE=1 HF_HUB_CACHE="$(cd "$snapshot/../../.." && pwd)"
exec "$(dirname "$py")/vllm" serve "$repo_id" --host 127.0.0.1 --max-model-len 512 --max-num-seqs 4 \
    --additional-config '{"precision": "bfloat16"}' "$@"
