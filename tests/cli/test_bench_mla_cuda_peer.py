"""``scripts/bench_mla_cuda_peer.py`` (vLLM's CUDA MLA peer built from vLLM's source) on the CPU:
where it finds vLLM's file, the sources it builds from, and its refusals."""

import re
import subprocess
import sys

import pytest
import torch

from cli_helpers import SCRIPTS, load_script

SCRIPT = SCRIPTS / "bench_mla_cuda_peer.py"
#: The includes of vLLM's cache_kernels_fused.cu (CUDA path) that the stand-ins replace.
VLLM_INCLUDES = ("cuda_compat.h", "dispatch_utils.h", "quantization/w8a8/fp8/common.cuh",
                 "quantization/w8a8/fp8/nvidia/quant_utils.cuh")


@pytest.fixture(scope="module")
def peer():
    return load_script("bench_mla_cuda_peer")


def test_finds_the_file_from_a_checkout_its_csrc_or_itself(peer, tmp_path):
    cu = tmp_path / "csrc" / "cache_kernels_fused.cu"
    cu.parent.mkdir()
    cu.write_text("// vLLM's file\n")
    for where in (tmp_path, tmp_path / "csrc", cu):
        assert peer.find_cuda_file(str(where)) == cu
    with pytest.raises(ValueError, match="--vllm-source"):
        peer.find_cuda_file(str(tmp_path / "nowhere"))


def test_sources_are_the_file_unchanged_beside_a_stand_in_for_each_include(peer, tmp_path):
    cu = tmp_path / "cache_kernels_fused.cu"
    text = "".join(f'#include "{name}"\n' for name in VLLM_INCLUDES) + "void f() {}\n"
    cu.write_text(text)
    build = tmp_path / "build"
    build.mkdir()
    kernel, binding = peer.write_sources(cu, build)
    assert kernel.read_text() == text and binding.name == "binding.cpp"
    for name in re.findall(r'#include "([^"]+)"', text):
        assert (build / name).is_file(), name
    assert "concat_and_cache_mla_rope_fused" in binding.read_text()


def test_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would build and time")
    out = subprocess.run([sys.executable, "-P", str(SCRIPT), "--vllm-source", "."], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == "bench_mla_cuda_peer: needs a CUDA GPU"


def test_refuses_a_token_count_below_one():
    out = subprocess.run([sys.executable, "-P", str(SCRIPT), "--vllm-source", ".", "--tokens", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--tokens" in out.stderr


def test_baseline_is_another_ops_folder_imported_apart(peer, tmp_path):
    import shutil

    import vllm_ascend_ext.ops as ours

    copy = tmp_path / "ops"
    shutil.copytree(ours.__path__[0], copy, ignore=shutil.ignore_patterns("__pycache__"))
    base = peer.load_ops(str(copy))
    assert base.__name__ == "baseline_ops" and base.split_qkv_rmsnorm_rope_mla is not ours.split_qkv_rmsnorm_rope_mla
    assert base.mla_q_rope_.__module__.startswith("baseline_ops.")
    with pytest.raises(ValueError, match="--baseline"):
        peer.load_ops(str(tmp_path))
