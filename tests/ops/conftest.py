"""Fixtures of the op tests (their shared helpers are in ``op_checks.py``)."""

import importlib

import pytest
import torch

from op_checks import FRAMES, GUARD_COLUMNS, POISON, SENTINEL, check_sentinels


@pytest.fixture
def poisoned(monkeypatch):
    """Out-of-place outputs are allocated full of NaN, so an unwritten element fails the check,
    inside a frame of sentinels, so a write outside an output fails :func:`check_sentinels`."""
    def _new_output(qkv, num_tokens, columns):
        frame = torch.full((num_tokens + 2, columns + GUARD_COLUMNS), SENTINEL, dtype=qkv.dtype,
                           device=qkv.device)
        out = frame[1:num_tokens + 1, :columns]
        out.fill_(POISON[qkv.dtype])
        FRAMES.append((frame, columns))
        return out

    FRAMES.clear()
    # The op modules whose launchers allocate the outputs (the package re-exports each function
    # under its module's name): the prologue's, which the KV-cache op launches through too, and MLA's.
    for name in ("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_mla"):
        monkeypatch.setattr(importlib.import_module(f"vllm_ascend_ext.ops.{name}"), "_new_output", _new_output)
    yield
    check_sentinels()
