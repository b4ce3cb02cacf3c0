"""Assertions and loaders shared by the CLI tests."""

import importlib.util
from pathlib import Path

#: The checkout's ``scripts/`` folder.
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the scripts are no package), without running its main."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_one_line_error(result, code: int = 2, *fragments: str) -> None:
    """A failed call: the given status, one line on stderr naming the fragments, no traceback."""
    assert result.code == code, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "error:" in lines[0]
    assert "Traceback" not in result.err + result.out
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
