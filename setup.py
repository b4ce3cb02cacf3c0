"""Build script: the package ``vllm_ascend_ext``, with ``ops/`` installed as ``vllm_ascend_ext.ops``.

The AscendC fallback (``csrc/``) is built with CANN's toolchain when ``ASCEND_HOME_PATH`` is
set and skipped with one log line otherwise; ``VLLM_ASCEND_EXT_BUILD_ASCENDC=1`` forces the
build (and fails without CANN), ``=0`` skips it. ``VLLM_ASCEND_EXT_SOC`` picks the SoC.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithAscendC(build_py):
    """``build_py`` plus the CMake build of ``csrc/`` when CANN is present (or forced)."""

    def run(self):
        super().run()
        switch = os.environ.get("VLLM_ASCEND_EXT_BUILD_ASCENDC", "").strip()
        cann = os.environ.get("ASCEND_HOME_PATH")
        if switch == "0" or (switch != "1" and not cann):
            why = "VLLM_ASCEND_EXT_BUILD_ASCENDC=0" if switch == "0" else "ASCEND_HOME_PATH is not set"
            print(f"vllm-ascend-ext: AscendC kernels not built ({why})", file=sys.stderr)
            return
        if not cann:
            raise RuntimeError("VLLM_ASCEND_EXT_BUILD_ASCENDC=1 but ASCEND_HOME_PATH is not set "
                               "(source CANN's set_env.sh)")
        out = ROOT / "build" / "ascendc"
        soc = os.environ.get("VLLM_ASCEND_EXT_SOC", "Ascend910B3")
        subprocess.check_call(["cmake", "-S", str(ROOT / "csrc"), "-B", str(out), f"-DSOC_VERSION={soc}",
                               f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 1)])
        lib = out / "libvllm_ascend_ext_ascendc.so"
        for dest in (Path(self.build_lib) / "vllm_ascend_ext", ROOT / "vllm_ascend_ext"):  # wheel, editable
            if dest.is_dir():
                shutil.copy2(lib, dest / lib.name)


setup(
    name="vllm-ascend-ext",
    version="0.1.0",
    description="Fused split-QKV + q/k RMSNorm + RoPE for vLLM on Ascend NPUs (and CUDA)",
    python_requires=">=3.10",
    packages=[
        "vllm_ascend_ext",
        "vllm_ascend_ext.cli",
        "vllm_ascend_ext.ops",
        "vllm_ascend_ext.ops.tiling",
    ],
    package_dir={
        "vllm_ascend_ext": "vllm_ascend_ext",
        "vllm_ascend_ext.ops": "ops",
    },
    install_requires=["torch>=2.5", "numpy"],
    extras_require={"plot": ["matplotlib"]},
    entry_points={
        "console_scripts": ["vllm-ascend-ext = vllm_ascend_ext.cli:main"],
        "vllm.general_plugins": ["vllm_ascend_ext = vllm_ascend_ext:register"],
    },
    cmdclass={"build_py": BuildPyWithAscendC},
)
