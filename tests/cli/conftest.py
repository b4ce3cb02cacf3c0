"""Helpers for the CLI tests: run ``vllm-ascend-ext`` in-process and capture what it printed."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_ascend_ext.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass
class Result:
    """Exit status and output of one CLI call."""

    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Call ``vllm-ascend-ext`` with a list of arguments; returns a :class:`Result`."""

    def call(*argv):
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call


@pytest.fixture
def fixtures() -> Path:
    """The folder of profile fixture files (synthetic numbers in the documented layouts)."""
    return FIXTURES
