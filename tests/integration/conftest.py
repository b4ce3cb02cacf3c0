"""The end-to-end tests' ``runs`` fixture (``e2e.py`` holds what it runs)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(model, dtype, fusion, fail_heads=None, kv_cache=True) -> (outputs, log)``: each run once per
    test module and process."""
    import e2e  # a helper module beside this file

    cache: dict = {}

    def get(model, dtype, fusion, fail_heads=None, kv_cache=True):
        key = (model, dtype, fusion, fail_heads, kv_cache)
        if key not in cache:
            cache[key] = e2e.run(model, dtype, tmp_path_factory.mktemp("vllm"), fusion, fail_heads, kv_cache)
        return cache[key]

    return get
