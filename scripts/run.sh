#!/usr/bin/env bash
# The main job: check the fused op against a float64 reference and time it against the
# unfused eager and torch.compile paths on this machine's device (NPU, CUDA GPU, or the CPU
# through the Triton interpreter). Installs what it needs into .venv/main first; arguments go
# to `vllm-ascend-ext bench` (see --help). Results land in results/bench/.
#
# On a machine whose Python already has torch for its accelerator (torch_npu + triton-ascend,
# or CUDA torch + triton), skip this script: `pip install -e . && vllm-ascend-ext bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
setup_main
exec "$(dirname "$MAIN_PY")/vllm-ascend-ext" bench "$@"
