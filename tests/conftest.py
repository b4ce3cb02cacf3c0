"""Shared test setup: the device under test, and the Triton interpreter when there is no GPU.

Without a CUDA GPU the kernels run through the Triton interpreter on CPU tensors; that must be
decided before Triton is imported, which is why it happens here. ``VLLM_ASCEND_EXT_TEST_DEVICE``
forces the device (``cpu`` or ``cuda``).
"""

import os

import pytest
import torch

from vllm_ascend_ext.ops import settings  # imports no Triton

DEVICE = settings.test_device() or (
    "cuda" if torch.cuda.is_available() and not settings.triton_interpret() else "cpu")
if DEVICE == "cpu":
    os.environ[settings.TRITON_INTERPRET] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the kernels under test run on."""
    return torch.device(DEVICE)


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run the full tier too: the cases marked `full` (exhaustive grids; tests/README.md)")


def pytest_collection_modifyitems(config, items):
    """Without ``--full``, deselect the cases marked ``full`` (the default tier)."""
    if config.getoption("--full"):
        return
    kept = [item for item in items if item.get_closest_marker("full") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full")])
        items[:] = kept


@pytest.fixture(autouse=True)
def _fresh_launch_caches():
    """Each test starts with empty launch caches: tests patch plans and allocators that a
    prepared call would otherwise keep from an earlier test."""
    from vllm_ascend_ext.ops import launch_cache

    launch_cache.clear()
    yield
