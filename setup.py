"""Build script: the package ``vllm_ascend_ext``, with ``ops/`` installed as ``vllm_ascend_ext.ops``.

The AscendC fallback (``csrc/``) is built with CANN's toolchain when ``ASCEND_HOME_PATH`` is
set and skipped with one log line otherwise; ``VLLM_ASCEND_EXT_BUILD_ASCENDC`` on forces the
build (and fails without CANN), off skips it. ``VLLM_ASCEND_EXT_SOC`` picks the SoC. Both are
read by ``ops/settings.py`` (loaded here by path: the package is not installed yet), by the
same rules as everywhere else.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _settings():
    """``ops/settings.py`` (standard library only), loaded from the source tree."""
    spec = importlib.util.spec_from_file_location("_vllm_ascend_ext_setup_settings", ROOT / "ops" / "settings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ascendc_build() -> tuple[bool, str]:
    """Whether to build the AscendC fallback, and why (from the settings and ``ASCEND_HOME_PATH``).

    Raises
    ------
    ValueError
        ``VLLM_ASCEND_EXT_BUILD_ASCENDC`` is not a boolean.
    RuntimeError
        The build is forced but CANN is not set up.
    """
    settings = _settings()
    switch = settings.build_ascendc()
    cann = os.environ.get("ASCEND_HOME_PATH")
    if switch is False:
        return False, f"{settings.BUILD_ASCENDC} is off"
    if switch is None and not cann:
        return False, "ASCEND_HOME_PATH is not set"
    if not cann:
        raise RuntimeError(f"{settings.BUILD_ASCENDC} is on but ASCEND_HOME_PATH is not set "
                           "(source CANN's set_env.sh)")
    return True, f"for {settings.soc()}"


class BuildPyWithAscendC(build_py):
    """``build_py`` plus the CMake build of ``csrc/`` when CANN is present (or forced)."""

    def run(self):
        super().run()
        build, why = ascendc_build()
        if not build:
            print(f"vllm-ascend-ext: AscendC kernels not built ({why})", file=sys.stderr)
            return
        out = ROOT / "build" / "ascendc"
        soc = _settings().soc()
        subprocess.check_call(["cmake", "-S", str(ROOT / "csrc"), "-B", str(out), f"-DSOC_VERSION={soc}",
                               f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 1)])
        lib = out / "libvllm_ascend_ext_ascendc.so"
        for dest in (Path(self.build_lib) / "vllm_ascend_ext", ROOT / "vllm_ascend_ext"):  # wheel, editable
            if dest.is_dir():
                shutil.copy2(lib, dest / lib.name)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import ascendc_build
    setup(
        name="vllm-ascend-ext",
        version="0.1.0",
        description="Fused split-QKV + q/k RMSNorm + RoPE for vLLM on Ascend NPUs (and CUDA)",
        python_requires=">=3.10",
        packages=[
            "vllm_ascend_ext",
            "vllm_ascend_ext.bench",
            "vllm_ascend_ext.cli",
            "vllm_ascend_ext.hook",
            "vllm_ascend_ext.kernels",
            "vllm_ascend_ext.passes",
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
