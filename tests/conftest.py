"""Shared test setup: the device under test, and the Triton interpreter when there is no GPU.

Without a CUDA GPU the kernels run through the Triton interpreter on CPU tensors; that must be
decided before Triton is imported, which is why it happens here. ``VLLM_ASCEND_EXT_TEST_DEVICE``
forces the device (``cpu`` or ``cuda``).
"""

import os

import torch

_forced = os.environ.get("VLLM_ASCEND_EXT_TEST_DEVICE")
DEVICE = _forced or ("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the kernels under test run on."""
    return torch.device(DEVICE)
