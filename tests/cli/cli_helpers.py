"""Assertions shared by the CLI tests."""


def assert_one_line_error(result, code: int = 2, *fragments: str) -> None:
    """A failed call: the given status, one line on stderr naming the fragments, no traceback."""
    assert result.code == code, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "error:" in lines[0]
    assert "Traceback" not in result.err + result.out
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
