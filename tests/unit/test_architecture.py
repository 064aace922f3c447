"""The import picture, read from the source with ast (nothing is imported): data flows one way,
sources -> index -> exporter / reconciler, wired by node_workload_summary; kubeindex's layers
(runtime, model, client, watch) import only the layers below them, so only the client talks to
the API and the model never does I/O; the modules import one another without a cycle; no test
module imports another test module or conftest; nothing takes another module's private
(underscore) name; docs/architecture.md names every product module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.paths import ROOT

PRODUCT = ("kubeindex", "exporter", "reconciler", "node_workload_summary")
TOOLS = ("localkube", "dashboards", "alerts", "deploy", "demo", "bench", "tests")
# Which product package may import which: the service's one-way flow.
ALLOWED = {
    "kubeindex": {"kubeindex"},
    "exporter": {"exporter", "kubeindex"},
    "reconciler": {"reconciler", "kubeindex"},
    "node_workload_summary": set(PRODUCT),
}
# kubeindex's layers, lowest first: each may import itself and those before it.
LAYERS = ("kubeindex.runtime", "kubeindex.model", "kubeindex.client", "kubeindex.watch")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every first-party module."""
    found = {}
    for package in PRODUCT + TOOLS:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "generated" in path.parts or "results" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, imported name or "") for each first-party import of a module, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names if alias.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.append((f"{base}.{alias.name}", ""))  # a submodule
                elif base in known:
                    out.append((base, alias.name))
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {module for module, _ in imports(name, path, known) if module != name}
            for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for other in sorted(edges.get(module, ())):
            if state.get(other) == "open":
                found.append([*path[path.index(other):], other])
            elif other not in state:
                visit(other, [*path, other])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_modules_import_one_another_without_a_cycle() -> None:
    edges = graph()
    # A package's __init__ importing its own modules is no cycle of meaning: leave those edges out.
    edges = {m: {o for o in others if not (m == top(m) and top(o) == m)} for m, others in edges.items()}
    assert cycles(edges) == []


def test_data_flows_one_way_and_the_service_never_imports_the_tooling() -> None:
    wrong = [f"{module} imports {other}" for module, others in graph().items() if top(module) in PRODUCT
             for other in others if top(other) not in ALLOWED[top(module)]]
    assert wrong == []


def layer(module: str) -> int | None:
    """A kubeindex module's layer (its index in LAYERS); None outside them (the package itself)."""
    return next((i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")), None)


def layering_violations(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a layer's module that reaches the package itself or a layer above."""
    wrong = []
    for module, others in edges.items():
        here = layer(module)
        if here is None:
            continue
        for other in sorted(o for o in others if top(o) == "kubeindex"):
            there = layer(other)
            if there is None or there > here:
                wrong.append(f"{module} imports {other}")
    return wrong


def test_kubeindex_layers_import_only_the_layers_below_them() -> None:
    edges = graph()
    assert {layer(m) for m in edges if top(m) == "kubeindex"} == {None, *range(len(LAYERS))}, "a layer is gone"
    every = [m for m in edges if top(m) == "kubeindex" and m != "kubeindex" and m not in LAYERS]
    assert [m for m in every if layer(m) is None] == [], "a kubeindex module outside every layer"
    assert layering_violations(edges) == []


def test_the_layer_rule_catches_a_model_that_imports_the_client() -> None:
    """The rule itself, on the import that would break it most: the model reaching for the API."""
    edges = graph()
    assert "kubeindex.model.index" in edges and "kubeindex.client.api" in edges
    edges["kubeindex.model.index"] = edges["kubeindex.model.index"] | {"kubeindex.client.api"}
    edges["kubeindex.runtime.clock"] = edges["kubeindex.runtime.clock"] | {"kubeindex.model.objects"}
    assert layering_violations(edges) == ["kubeindex.model.index imports kubeindex.client.api",
                                          "kubeindex.runtime.clock imports kubeindex.model.objects"]


def test_no_test_module_imports_another_or_conftest() -> None:
    wrong = [f"{module} imports {other}" for module, others in graph().items() if top(module) == "tests"
             for other in others if other.startswith("tests.test_") or other == "tests.conftest"]
    assert wrong == []


def test_no_module_takes_another_modules_private_name() -> None:
    known = modules()
    wrong = [f"{name} takes {imported} from {module}" for name, path in known.items()
             for module, imported in imports(name, path, known)
             if imported.startswith("_") and not imported.startswith("__") and module != name]
    assert wrong == []


def test_the_architecture_page_names_every_product_module() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)+\.py)`", page))
    product = {str(p.relative_to(ROOT)) for name, p in modules().items()
               if top(name) in PRODUCT and p.name != "__init__.py"}
    assert product - named == set(), "modules the page does not name"
    every = {str(p.relative_to(ROOT)) for p in modules().values()}
    assert named - every == set(), "the page names modules that are gone"
