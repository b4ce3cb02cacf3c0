"""Build and drive the host build of the AscendC kernel (g++ against csrc/ascendc_host_sim).

:func:`build` compiles a shared library once per source hash into ``build/host_sim/<hash>/``
(git-ignored) and reuses it; :class:`HostSim` runs the kernel through it with every tensor of the
launch registered as global memory, keeping the byte-level read/write maps of the last launch.
:func:`register_cpu_launch` makes that launch the CPU implementation of the AscendC torch ops:
the proof without hardware, not a CPU backend, so it lives here and not in the package.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vllm_ascend_ext.kernels import ascendc
from vllm_ascend_ext.kernels.ascendc_plan import Tiling

ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = ROOT / "csrc" / "ascendc_host_sim"
OP_DIR = ROOT / "csrc" / "split_qkv_rmsnorm_rope"
KV_OP_DIR = ROOT / "csrc" / "split_qkv_rmsnorm_rope_kv_cache"
#: The host build of both ops: the KV-cache op's host-sim source includes the prologue op's.
HOST_SIM_SOURCE = KV_OP_DIR / "split_qkv_rmsnorm_rope_kv_cache_host_sim.cpp"
BUILD_DIR = ROOT / "build" / "host_sim"
CXXFLAGS = ("-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared")


def build(main: Path, name: str) -> Path:
    """Compile ``main`` (with the host sim and both ops' folders on the include path), cached.

    The cache key hashes the compiler flags and every file under the three csrc folders plus
    ``main``, so an edit anywhere rebuilds. Concurrent builds each write a temporary file and
    rename it into place.
    """
    digest = hashlib.sha256(" ".join(CXXFLAGS).encode())
    for path in sorted([*SIM_DIR.glob("*"), *OP_DIR.glob("*"), *KV_OP_DIR.glob("*"), main]):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    out = BUILD_DIR / digest.hexdigest()[:16] / f"lib{name}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX") or shutil.which("g++") or "g++"
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *CXXFLAGS, f"-I{SIM_DIR}", f"-I{OP_DIR}", f"-I{KV_OP_DIR}", str(main), "-o", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"host build failed: {' '.join(cmd)}\n{result.stderr}")
    os.replace(tmp, out)
    return out


class SimViolation(RuntimeError):
    """The host layer (or the kernel) rejected a launch; the message says why."""


@dataclass
class Region:
    """One registered GM tensor of the last launch and what the kernel did to its bytes."""

    name: str
    base: int
    nbytes: int
    read: np.ndarray
    written: np.ndarray


class HostSim:
    """The kernel's host build, callable like the NPU launch."""

    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        lib.sqrr_sim_register_gm.restype = ctypes.c_int
        lib.sqrr_sim_register_gm.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        lib.sqrr_sim_access_map.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64]
        lib.sqrr_sim_ub_peak.restype = ctypes.c_uint32
        lib.sqrr_sim_blocks_run.restype = ctypes.c_uint32
        lib.sqrr_sim_tiling_layout.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.sqrr_sim_launch.restype = ctypes.c_int
        lib.sqrr_sim_launch.argtypes = [ctypes.POINTER(Tiling), ctypes.c_uint32, ctypes.c_uint32] + [
            ctypes.c_void_p
        ] * 11 + [ctypes.c_char_p, ctypes.c_int]
        lib.sqrr_sim_launch_kv.restype = ctypes.c_int
        lib.sqrr_sim_launch_kv.argtypes = [ctypes.POINTER(Tiling), ctypes.c_uint32, ctypes.c_uint32] + [
            ctypes.c_void_p
        ] * 16 + [ctypes.c_char_p, ctypes.c_int]
        self.lib = lib
        self.regions: dict[str, Region] = {}
        self.ub_peak = 0
        self.blocks_run = 0
        self.block_dim = 0
        self.tiling: Tiling | None = None
        self.ub_bytes: int | None = None  # override of the per-core UB (tests of the host layer)

    def tiling_layout(self) -> list[int]:
        """``[sizeof, offsetof(field) ...]`` of the C struct, in declaration order."""
        out = (ctypes.c_uint64 * 64)()
        n = self.lib.sqrr_sim_tiling_layout(out, 64)
        return list(out[:n])

    def launch(self, qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, block_dim, tiling):
        """Run every block of the kernel; raise :class:`SimViolation` on any host-layer failure.

        ``v`` and ``gate`` are ``None`` unless the call writes them; an output with no elements
        (k of a q-only layer) is registered as nothing (its pointer is never dereferenced).
        """
        self._run(qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, None, block_dim, tiling)

    def launch_kv(self, qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, key_cache,
                  value_cache, slot_mapping, k_scale, v_scale, block_dim, tiling):
        """:meth:`launch` of ``split_qkv_rmsnorm_rope_kv_cache``'s entries: the caches (writable; one
        region when they view one tensor), the slots and the int8 scales (read-only) registered too.
        ``k``, ``v``, ``gate`` and the scales are ``None`` where the call does not use them."""
        kv = (key_cache, value_cache, slot_mapping, k_scale, v_scale)
        self._run(qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, kv, block_dim, tiling)

    def _run(self, qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, kv, block_dim, tiling):
        self.lib.sqrr_sim_reset_gm()
        self.regions = {}
        inplace = q.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
        tensors = [("qkv", qkv, inplace), ("cos_sin_cache", cache, False), ("positions", positions, False),
                   ("q_weight", q_weight, False), ("k_weight", k_weight, False), ("q_bias", q_bias, False),
                   ("k_bias", k_bias, False)]
        if not inplace:
            tensors += [("q_out", q, True), ("k_out", k, True), ("v_out", v, True)]
        tensors.append(("gate_out", gate, True))
        if kv is not None:
            key_cache, value_cache, slot_mapping, k_scale, v_scale = kv
            tensors += [("key_cache", key_cache, True), ("value_cache", value_cache, True),
                        ("slot_mapping", slot_mapping, False), ("k_scale", k_scale, False),
                        ("v_scale", v_scale, False)]
        for name, t, writable in tensors:
            if t is None or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            if any(r.base == storage.data_ptr() for r in self.regions.values()):
                continue
            index = self.lib.sqrr_sim_register_gm(storage.data_ptr(), storage.nbytes(), int(writable), name.encode())
            self.regions[name] = Region(name, storage.data_ptr(), storage.nbytes(), None, None)
            self.regions[name].index = index
        err = ctypes.create_string_buffer(1024)
        ub = self.ub_bytes if self.ub_bytes is not None else tiling.ubBytes

        def ptr(t):
            return None if t is None else t.data_ptr()

        common = (ptr(qkv), ptr(q), ptr(k), ptr(v), ptr(gate), ptr(cache), ptr(positions), ptr(q_weight),
                  ptr(k_weight), ptr(q_bias), ptr(k_bias))
        if kv is None:
            rc = self.lib.sqrr_sim_launch(ctypes.byref(tiling), block_dim, ub, *common, err, len(err))
        else:
            rc = self.lib.sqrr_sim_launch_kv(ctypes.byref(tiling), block_dim, ub, *common, *map(ptr, kv), err,
                                             len(err))
        self.ub_peak = self.lib.sqrr_sim_ub_peak()
        self.blocks_run = self.lib.sqrr_sim_blocks_run()
        self.block_dim = block_dim
        self.tiling = tiling
        for region in self.regions.values():
            for which, attr in ((0, "read"), (1, "written")):
                buf = np.zeros(region.nbytes, dtype=np.uint8)
                self.lib.sqrr_sim_access_map(region.index, which, buf.ctypes.data, region.nbytes)
                setattr(region, attr, buf.astype(bool))
        if rc != 0:
            raise SimViolation(err.value.decode())


def byte_mask(t: torch.Tensor, region: Region) -> np.ndarray:
    """Bytes of ``region`` (a storage) that the elements of view ``t`` occupy."""
    mask = np.zeros(region.nbytes, dtype=bool)
    size = t.element_size()
    offsets = torch.as_strided(
        torch.arange(t.untyped_storage().nbytes() // size), t.shape, t.stride(), t.storage_offset()
    ).reshape(-1).numpy()
    for b in range(size):
        mask[offsets * size + b] = True
    return mask


_cpu_launch: list = [None, None]
_cpu_library: list = []  # the Library holding the CPU registrations, kept alive for the session


def register_cpu_launch(launch, kv_launch) -> None:
    """Register CPU implementations of the AscendC ops around ``launch`` and ``kv_launch`` (once;
    again replaces them).

    ``launch(qkv, q, k, v, gate, cache, positions, q_weight, k_weight, q_bias, k_bias, block_dim,
    tiling)`` is :meth:`HostSim.launch`, ``kv_launch`` :meth:`HostSim.launch_kv`; the
    implementations are :func:`vllm_ascend_ext.kernels.ascendc.make_impl`'s and ``make_kv_impl``'s, the
    ones the NPU library is registered with.
    """
    _cpu_launch[:] = [launch, kv_launch]
    if _cpu_library:
        return
    lib = torch.library.Library("vllm_ascend_ext", "IMPL")
    for name, inplace in ((ascendc.OP_NAME, False), (ascendc.INPLACE_OP_NAME, True)):
        lib.impl(name, ascendc.make_impl(lambda *args: _cpu_launch[0](*args), inplace), "CPU")
    for name, inplace in ((ascendc.KV_OP_NAME, False), (ascendc.KV_INPLACE_OP_NAME, True)):
        lib.impl(name, ascendc.make_kv_impl(lambda *args: _cpu_launch[1](*args), inplace), "CPU")
    _cpu_library.append(lib)


def poison_new_outputs(monkeypatch, allocator: str) -> None:
    """Make ``ascendc.<allocator>`` (``_outputs``, ``_kv_outputs``) hand out its new outputs full of
    NaN, so an element the kernel does not write fails the comparison with the reference (in-place
    calls' outputs are views of qkv and stay as they are)."""
    allocate = getattr(ascendc, allocator)

    def poisoned(qkv, call):
        outputs = allocate(qkv, call)
        if not call.inplace:
            for out in outputs:
                out.fill_(float("nan"))
        return outputs

    monkeypatch.setattr(ascendc, allocator, poisoned)
