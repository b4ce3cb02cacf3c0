"""The command itself: --help for every subcommand, one-line usage errors, ``python -m``."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error

SUBCOMMANDS = ("doctor", "plan", "bench", "profile", "report")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert f"vllm-ascend-ext {command}" in result.out
    assert "--" in result.out  # options are listed


def test_top_level_help_lists_every_subcommand(cli):
    result = cli("--help")
    assert result.code == 0
    for command in SUBCOMMANDS:
        assert command in result.out


def test_no_subcommand_is_a_one_line_error(cli):
    assert_one_line_error(cli(), 2, "required")


def test_unknown_subcommand_is_a_one_line_error(cli):
    assert_one_line_error(cli("frobnicate"), 2, "frobnicate")


def test_unknown_option_is_a_one_line_error(cli):
    assert_one_line_error(cli("plan", "Qwen3-8B", "--frob"), 2, "--frob")


def test_python_dash_m_runs_the_same_command():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "vllm_ascend_ext.cli", "plan", "Qwen3-8B", "--target", "cuda"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "CUDA" in done.stdout and "tp=1" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "vllm_ascend_ext.cli", "plan", "NoSuchModel"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "NoSuchModel" in bad.stderr


PACKAGE = Path(__file__).resolve().parents[2] / "vllm_ascend_ext"
#: The modules this test holds to the layering rules: the command line, the benchmark library (its
#: package and every module in it) and the device probe (vllm_ascend_ext.devices).
LAYERED = ("vllm_ascend_ext.bench", "vllm_ascend_ext.devices")


def _layered(name: str) -> bool:
    return name in LAYERED or name.startswith("vllm_ascend_ext.bench.")


def _module_graph() -> dict:
    """Every import (module level or inside a function) between the package's own modules."""
    files = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("vllm_ascend_ext",) + path.relative_to(PACKAGE).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in files}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + (node.module.split(".") if node.module else []))
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module
                           for alias in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_through_the_command_line_or_the_benchmark():
    graph = _module_graph()
    assert "vllm_ascend_ext.cli.report" in graph["vllm_ascend_ext.cli.profile"]  # the graph sees imports
    mine = [c for c in _cycles(graph) if any(m.startswith("vllm_ascend_ext.cli") or _layered(m) for m in c)]
    assert mine == []


def test_the_library_layers_never_import_the_command_line():
    graph = _module_graph()
    layered = [name for name in graph if _layered(name)]
    assert "vllm_ascend_ext.bench.harness" in layered
    for name in layered:
        assert not [t for t in graph[name] if t.startswith("vllm_ascend_ext.cli")], name
    code = ("import sys, pkgutil, importlib, vllm_ascend_ext.bench as b, vllm_ascend_ext.devices as d; "
            "[importlib.import_module(f'vllm_ascend_ext.bench.{m.name}') for m in pkgutil.iter_modules(b.__path__)]; "
            "d.detect_device(); print(sorted(m for m in sys.modules if m.startswith('vllm_ascend_ext.cli')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_malformed_variable_from_inside_a_subcommand_is_one_line(cli, monkeypatch):
    """``SettingError`` is turned into one line wherever it is raised, not only where the CLI reads."""
    from vllm_ascend_ext.cli import doctor
    from vllm_ascend_ext.ops import settings

    def deep(forced_backend=None):
        settings.impl()

    monkeypatch.setattr(doctor, "collect", deep)
    monkeypatch.setenv("VLLM_ASCEND_EXT_IMPL", "fastest")
    assert_one_line_error(cli("doctor"), 2, "VLLM_ASCEND_EXT_IMPL='fastest'")
