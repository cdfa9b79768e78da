#!/usr/bin/env bash
# vLLM offline inference of Gemma 3 270M from the warm ttnn cache, as a user runs it: HF_HUB_OFFLINE=1,
# the model id, the prepared hub cache. Sets up .venv-vllm and prepares the model if needed, then runs
# scripts/offline_inference_tt.py (extra arguments pass through, e.g. --precision bfloat16 --max_tokens 32).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_vllm_env.sh"
py="${TT_VLLM_VENV:-$root/.venv-vllm}/bin/python"
cd "$root"
snapshot=$("$py" -m models.demos.real_models.prepare gemma3-270m 2>/dev/null | tail -n 1)
[ -d "$snapshot" ] || { echo "run_vllm_demo: preparing Gemma 3 270M failed; run: $py -m models.demos.real_models.prepare gemma3-270m" >&2; exit 1; }
export HF_HUB_OFFLINE=1 HF_HUB_CACHE="$(cd "$snapshot/../../.." && pwd)"
exec "$py" scripts/offline_inference_tt.py --model google/gemma-3-270m "$@"
