"""bench/ stays a tool: no bench module reaches into another's private (underscore) names, the
bench modules import one another without a cycle (what they share is in bench/common.py and
bench/populate.py), every bench script takes its --out from bench.common.add_out, and each is
listed in the README's layout and in docs/benchmarks.md's table. Read from the source with ast:
nothing is imported or run."""

from __future__ import annotations

import ast
import re

from tests.paths import ROOT

BENCH = ROOT / "bench"


def bench_imports(source: str) -> list[tuple[str, str]]:
    """(bench module, name) for every name a module's source takes from a bench module, at any
    depth (an import inside a function counts); name "" for a module imported whole. Names used
    through a whole module (`scale._churn` after `from . import scale`) count as taken from it."""
    tree = ast.parse(source)
    taken: list[tuple[str, str]] = []
    whole: dict[str, str] = {}  # local name -> bench module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == "bench" or module.startswith("bench."):
                package = module.removeprefix("bench").lstrip(".")
                for alias in node.names:
                    if package:
                        taken.append((package.split(".")[0], alias.name))
                    else:  # `from . import scale` / `from bench import scale`
                        taken.append((alias.name, ""))
                        whole[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bench."):
                    module = alias.name.split(".")[1]
                    taken.append((module, ""))
                    if alias.asname:
                        whole[alias.asname] = module
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in whole:
            taken.append((whole[node.value.id], node.attr))
    return taken


def private_names(sources: dict[str, str]) -> list[str]:
    return [f"bench.{module} takes {name} from bench.{other}" for module, source in sorted(sources.items())
            for other, name in bench_imports(source) if name.startswith("_")]


def cycles(sources: dict[str, str]) -> list[list[str]]:
    """Each import cycle among the modules, found by a depth-first walk (one per back edge)."""
    graph = {module: sorted({other for other, _ in bench_imports(source) if other in sources and other != module})
             for module, source in sources.items()}
    found: list[list[str]] = []
    state: dict[str, str] = {}  # module -> "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for other in graph[module]:
            if state.get(other) == "open":
                found.append([*path[path.index(other):], module, other])  # other is on the path: open
            elif other not in state:
                visit(other, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return found


def bench_sources() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(BENCH.glob("*.py")) if path.stem != "__init__"}


def scripts(sources: dict[str, str]) -> list[str]:
    """The modules run as `python -m bench.<name>`: those with an `if __name__ == "__main__"`."""
    return sorted(module for module, source in sources.items()
                  if any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                         for node in ast.parse(source).body))


def calls(source: str, function: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] == function]


def test_no_bench_module_takes_another_ones_private_names() -> None:
    assert private_names(bench_sources()) == []


def test_bench_modules_import_each_other_without_a_cycle() -> None:
    assert cycles(bench_sources()) == []


def test_every_bench_script_has_the_one_out_flag() -> None:
    sources = bench_sources()
    assert len(scripts(sources)) >= 11
    for module in scripts(sources):
        assert len(calls(sources[module], "add_out")) == 1, module
        own = [c for c in calls(sources[module], "add_argument") if "'--out'" in ast.unparse(c)]
        assert not own, f"bench.{module} defines --out itself"


def readme_bench_entry() -> str:
    """The README layout's bench/ entry: its line and the indented lines after it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("bench/ "))
    rest = lines[start + 1:]
    end = next((i for i, line in enumerate(rest) if not line.startswith(" ")), len(rest))
    return " ".join([lines[start], *rest[:end]])


def test_every_bench_script_is_listed() -> None:
    names = scripts(bench_sources())
    entry = readme_bench_entry()
    table = set(re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "benchmarks.md").read_text(), re.M))
    assert [n for n in names if not re.search(rf"\b{n}\b", entry)] == [], "missing from the README's layout"
    assert table == set(names), "docs/benchmarks.md's table of benches"


def test_the_checks_see_what_they_look_for() -> None:
    sources = {
        "a": "from .b import _helper, public\n",
        "b": "def f():\n    from bench.c import thing\n",
        "c": "from . import a\nx = a._private\n",
        "d": "import bench.a as other\nfrom kubeindex.index import _interned\n",
    }
    assert private_names(sources) == ["bench.a takes _helper from bench.b", "bench.c takes _private from bench.a"]
    assert cycles(sources) == [["a", "b", "c", "a"]]
    assert cycles({"x": "from .y import f\n", "y": "from .z import g\n", "z": ""}) == []
