"""The package's layout: no import circle between its modules, no private name taken from another
module (issue 29). Read from the source with ``ast`` (imports inside functions count: a lazy
import is still an edge of the design); ``ops/`` is the installed ``vllm_ascend_ext.ops``."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "ops":
        parts.insert(0, "vllm_ascend_ext")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for top in ("ops", "vllm_ascend_ext") for p in (ROOT / top).rglob("*.py")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(name: str, path: Path, modules: dict) -> tuple[set[str], list[str]]:
    """The package modules ``name`` imports, and the private names it takes from them."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges, private, aliases = set(), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    edges.add(f"{target}.{alias.name}")
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
                elif target in modules:
                    edges.add(target)
                    if _private(alias.name):
                        private.append(f"{name} imports {alias.name} from {target}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    edges.add(alias.name)
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _private(node.attr)):
            private.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return edges - {name}, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_and_no_private_import():
    modules = _modules()
    assert "vllm_ascend_ext.ops.validation" in modules and "vllm_ascend_ext.kernels.impl" in modules
    graph, private = {}, []
    for name, path in modules.items():
        graph[name], taken = _imports(name, path, modules)
        private += taken
    assert _cycles(graph) == []
    assert private == []


def test_the_checks_can_fail():
    """A circle and a private import, as the checks see them."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _private("_trace") and not _private("__all__") and not _private("trace")
