"""bench/ stays a tool: no bench module reaches into another's private (underscore) names, the
bench modules import one another without a cycle (what they share is in bench/common.py and
bench/populate.py), every bench script takes its --out from bench.common.add_out, each is
listed in the README's layout and in docs/benchmarks.md's table, and each has a smoke run in make
test (a row of tests/support/bench_smoke.py's SMOKE). Read from the source with ast: nothing is
imported or run."""

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


def entries(sources: dict[str, str]) -> list[str]:
    """The bench modules a user runs: those with a top-level ``main``, an argument parser or an
    ``if __name__ == "__main__"`` (what the benches share has none of them)."""
    def runnable(source: str) -> bool:
        tree = ast.parse(source)
        return (any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)
                or bool(calls(source, "ArgumentParser")) or any(
                    isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body))

    return sorted(module for module, source in sources.items() if runnable(source))


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


def smoke_rows(source: str) -> list[str]:
    """The names of the rows of the module-level dict ``SMOKE`` in a test module's source."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "SMOKE" and isinstance(node.value, ast.Dict):
                return [ast.literal_eval(key) for key in node.value.keys if key is not None]
    raise AssertionError("no SMOKE = {...} in the module")


def test_every_bench_has_a_smoke_run() -> None:
    names = entries(bench_sources())
    rows = smoke_rows((ROOT / "tests" / "support" / "bench_smoke.py").read_text())
    assert {"common", "populate", "plot"}.isdisjoint(names)
    assert names == scripts(bench_sources())
    assert [n for n in names if n not in rows] == [], "a bench without a row in tests/support/bench_smoke.py's SMOKE"
    assert [n for n in rows if n not in names] == [], "a row of SMOKE for no bench"


def test_the_checks_see_what_they_look_for() -> None:
    sources = {
        "a": "from .b import _helper, public\n",
        "b": "def f():\n    from bench.c import thing\n",
        "c": "from . import a\nx = a._private\n",
        "d": "import bench.a as other\nfrom kubeindex.model.index import _interned\n",
    }
    assert private_names(sources) == ["bench.a takes _helper from bench.b", "bench.c takes _private from bench.a"]
    assert cycles(sources) == [["a", "b", "c", "a"]]
    assert cycles({"x": "from .y import f\n", "y": "from .z import g\n", "z": ""}) == []
    assert entries({"a": "def main() -> int:\n    return 0\n", "b": "import argparse\np = argparse.ArgumentParser()\n",
                    "c": "if __name__ == '__main__':\n    pass\n", "d": "def helper() -> None: ...\n"}
                   ) == ["a", "b", "c"]
    assert smoke_rows("X = 1\nSMOKE: dict[str, int] = {'scale': 1, 'sync': 2}\n") == ["scale", "sync"]
