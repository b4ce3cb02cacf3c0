"""Fixtures of the AscendC host-build tests: the built libraries, built once per source hash."""

from pathlib import Path

import pytest

from host_sim import HOST_SIM_SOURCE, HostSim, build, register_cpu_launch

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def host_sim() -> HostSim:
    """The kernels' host build (both ops), registered as the CPU implementation of the AscendC ops."""
    sim = HostSim(build(HOST_SIM_SOURCE, "split_qkv_rmsnorm_rope_kv_cache_host_sim"))
    register_cpu_launch(sim.launch, sim.launch_kv)
    return sim


@pytest.fixture(scope="session")
def selftest_lib():
    """Small kernels that break one hardware rule each (tests of the host layer itself)."""
    import ctypes

    lib = ctypes.CDLL(str(build(HERE / "host_sim_selftest.cpp", "host_sim_selftest")))
    lib.selftest_run.restype = ctypes.c_int
    lib.selftest_run.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    return lib
