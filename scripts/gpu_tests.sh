#!/usr/bin/env bash
# Run the op test suite compiled on a CUDA GPU (no Triton interpreter).
#
#   bash scripts/gpu_tests.sh [pytest args...]              # every file under tests/ops
#   bash scripts/gpu_tests.sh tests/ops/test_split_qkv_rmsnorm_rope_kv_cache.py [pytest args...]
#
# tests/ops holds both ops' suites (test_split_qkv_rmsnorm_rope.py, and since issue 11
# test_split_qkv_rmsnorm_rope_kv_cache.py) and the autograd and settings tests; compiled
# (VLLM_ASCEND_EXT_TEST_DEVICE=cuda) they add their GPU-only large sizes (~4k and ~16k tokens).
# Arguments naming paths under tests/ run those files instead of all of tests/ops (one file fits
# a 10-minute slot better than the whole suite).
#
# Needs python3 with torch (CUDA), triton, numpy and pytest; vLLM is not needed. The package is
# laid out as it installs (ops/ becomes vllm_ascend_ext.ops) in build/gpu-site, so no pip or
# network access is needed on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
site=build/gpu-site
rm -rf "$site" && mkdir -p "$site"
cp -r vllm_ascend_ext "$site/vllm_ascend_ext"
cp -r ops "$site/vllm_ascend_ext/ops"
export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
targets=tests/ops
for arg in "$@"; do
  case "$arg" in tests/*) targets= ;; esac
done
python3 -P -c 'import torch, triton; assert torch.cuda.is_available(), "no CUDA device"; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
# shellcheck disable=SC2086  # $targets is one path or nothing
VLLM_ASCEND_EXT_TEST_DEVICE=cuda python3 -P -m pytest -q -p no:cacheprovider $targets "$@"
