"""``ascendc.library_status``: where the CANN-built library is and whether it is a shared object.

Only the ELF header is read (the real library needs CANN to load), so a real shared object of
this machine stands in for it: torch's ``libc10.so``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_ascend_ext.kernels import ascendc

ENV = "VLLM_ASCEND_EXT_ASCENDC_LIB"
TORCH_SHARED_OBJECT = Path(torch.__file__).resolve().parent / "lib" / "libc10.so"


@pytest.fixture(autouse=True)
def _fresh_loader():
    ascendc.load_npu_library.cache_clear()
    yield
    ascendc.load_npu_library.cache_clear()


def _elf_header(e_type: int, *, byteorder: str = "little") -> bytes:
    """A 64-byte ELF64 header with only the identification and ``e_type`` filled in."""
    ident = b"\x7fELF" + bytes([2, 1 if byteorder == "little" else 2, 1]) + bytes(9)
    return ident + e_type.to_bytes(2, byteorder) + bytes(46)


def test_unset_and_nothing_built_here(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert not Path(ascendc.__file__).with_name(ascendc.LIBRARY_NAME).exists()
    assert ascendc.library_status() == (None, None)
    assert ascendc.library_path() is None
    assert ascendc.load_npu_library() is False


def test_blank_variable_is_unset(monkeypatch):
    monkeypatch.setenv(ENV, "  ")
    assert ascendc.library_status() == (None, None)


def test_missing_path(monkeypatch, tmp_path):
    missing = tmp_path / "libvllm_ascend_ext_ascendc.so"
    monkeypatch.setenv(ENV, str(missing))
    assert ascendc.library_status() == (missing, "does not exist")
    assert ascendc.library_path() is None
    assert ascendc.load_npu_library() is False


def test_text_file_is_not_a_shared_library(monkeypatch):
    monkeypatch.setenv(ENV, "/etc/passwd")
    path, problem = ascendc.library_status()
    assert path == Path("/etc/passwd")
    assert problem == "is not a shared library (no ELF magic)"
    assert ascendc.library_path() is None
    assert ascendc.load_npu_library() is False


def test_directory_is_not_a_shared_library(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path))
    assert ascendc.library_status() == (tmp_path, "is not a shared library (not a regular file)")


@pytest.mark.parametrize("content,why", [
    (b"\x7fELF", "ELF header truncated at 4 bytes"),
    (_elf_header(2), "ELF type ET_EXEC, not ET_DYN"),
    (_elf_header(1, byteorder="big"), "ELF type ET_REL, not ET_DYN"),
    (_elf_header(3)[:5] + b"\x07" + _elf_header(3)[6:], "ELF data encoding 7"),
])
def test_elf_that_is_not_a_shared_object(monkeypatch, tmp_path, content, why):
    library = tmp_path / ascendc.LIBRARY_NAME
    library.write_bytes(content)
    monkeypatch.setenv(ENV, str(library))
    path, problem = ascendc.library_status()
    assert path == library and problem.startswith("is not a shared library (") and why in problem
    assert ascendc.library_path() is None


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_shared_object_header(monkeypatch, tmp_path, byteorder):
    library = tmp_path / ascendc.LIBRARY_NAME
    library.write_bytes(_elf_header(3, byteorder=byteorder))
    monkeypatch.setenv(ENV, str(library))
    assert ascendc.library_status() == (library, None)


def test_real_shared_object(monkeypatch):
    assert TORCH_SHARED_OBJECT.is_file()
    monkeypatch.setenv(ENV, str(TORCH_SHARED_OBJECT))
    assert ascendc.library_status() == (TORCH_SHARED_OBJECT, None)
    assert ascendc.library_path() == TORCH_SHARED_OBJECT
