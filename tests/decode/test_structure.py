"""The decoder's parts stay apart: no import circle inside mtp/decode (imports inside functions and for type hints
included), and nothing there reaches up into the commands, the benchmarks or argument parsing."""

import ast
from pathlib import Path

import pytest

DECODE = Path(__file__).resolve().parents[2] / "mtp" / "decode"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere in its text (``from a.b import c`` counts as a.b and as a.b.c)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def decode_graph() -> dict[str, set[str]]:
    modules = {
        ("mtp.decode" if p.stem == "__init__" else f"mtp.decode.{p.stem}"): p for p in sorted(DECODE.glob("*.py"))
    }
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], stack[len(stack) :] = "open", [node]
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_inside_decode():
    circle = cycle_in(decode_graph())
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_a_circle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted(DECODE.glob("*.py")), ids=lambda p: p.name)
def test_decode_imports_no_command_benchmark_or_argparse(path):
    reaching_up = {
        m for m in imports_of(path) if m == "argparse" or m.startswith(("mtp.commands", "mtp.benchmarks", "mtp.cli"))
    }
    assert not reaching_up, f"{path.name} imports {sorted(reaching_up)}"
