"""`kubectl nws`: the summaries under a name no other API claims.

kubectl runs ``kubectl-nws`` (this package's console script, on PATH) for ``kubectl nws ...``. A
plugin cannot extend ``kubectl get``, and ``kubectl get workloads`` lists Kueue's Workloads, or the
core ``scheduling.k8s.io`` ones, wherever those are served (docs/kubectl.md); ``kubectl nws
workloads`` lists the WorkloadSummaries on every cluster.

It reads the WorkloadSummaries and NodeSummaries only (kilobytes, as ``kubectl get
workloadsummaries`` does), and one Node's metadata for ``impact node/NAME``. The tables are the
API server's (the CRDs' printer columns, ``as=Table``), printed as kubectl prints them; the
kubeconfig is loaded as the service loads it (kubeindex.client.api: ``--kubeconfig``, ``$KUBECONFIG``,
the in-cluster service account, ``~/.kube/config``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from kubeindex.model.resources import NODE_SUMMARIES, NODES, WORKLOAD_SUMMARIES, Resource

if TYPE_CHECKING:  # imported when a command runs: --help answers without the API client's imports
    from kubeindex.client.api import ApiClient, ApiError

PROG = "kubectl nws"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PAGE = 500  # objects per LIST page, as kubectl's --chunk-size
TIMEOUT = 30.0  # seconds for one request
# kubectl's tabwriter (k8s.io/cli-runtime/pkg/printers/tabwriter.go): a cell is padded to the
# widest of its column plus 3 spaces, at least 6 wide; the last column is not padded.
MIN_WIDTH, PADDING = 6, 3
OUTPUTS = ("wide", "json", "yaml", "name")


WORKLOADS, POOLS = WORKLOAD_SUMMARIES, NODE_SUMMARIES
POOL_PREFIXES = ("pool", "pools", "nodesummary", "nodesummaries", "nsum")
NODE_PREFIXES = ("node", "nodes", "no")


class Failed(Exception):
    """What the plugin prints before it exits with status 1."""


# -- printing: pure, as kubectl prints ---------------------------------------------------------

def cell_text(value: Any) -> str:
    """A Table cell as kubectl prints it (Go's fmt.Sprint of the decoded JSON value)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def render(headers: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """Columns as kubectl's tabwriter aligns them; ``headers`` None: --no-headers."""
    lines = ([list(headers)] if headers is not None else []) + [list(r) for r in rows]
    if not lines:
        return ""
    columns = len(lines[0])
    widths = [max(MIN_WIDTH, max(len(line[i]) for line in lines) + PADDING) for i in range(columns - 1)]
    return "".join("".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + line[-1] + "\n"
                   for line in lines)


def table_columns(table: dict[str, Any], wide: bool) -> tuple[list[str], list[list[str]]]:
    """The headers and cells of an API server Table that kubectl prints: the columns of priority 0,
    and with ``wide`` the others too; headers upper-cased."""
    shown = [i for i, c in enumerate(table.get("columnDefinitions") or []) if wide or not c.get("priority")]
    headers = [str(table["columnDefinitions"][i]["name"]).upper() for i in shown]
    rows = [[cell_text(row["cells"][i]) if i < len(row["cells"]) else "" for i in shown]
            for row in table.get("rows") or []]
    return headers, rows


def row_namespace(row: dict[str, Any]) -> str:
    return str(((row.get("object") or {}).get("metadata") or {}).get("namespace") or "")


def nothing_found(namespace: str) -> str:
    """kubectl's words for an empty answer (on stderr)."""
    return f"No resources found in {namespace} namespace." if namespace else "No resources found"


def as_list(items: list[dict[str, Any]], kind: Resource) -> dict[str, Any]:
    """A list as `kubectl get -o json|yaml` prints one: kind List, each item with its apiVersion and kind."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": [{"apiVersion": kind.api_version, "kind": kind.kind, **item} for item in items]}


def dump(document: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=4) + "\n"
    return yaml.safe_dump(document, default_flow_style=False, sort_keys=True)


def object_name(kind: Resource, name: str) -> str:
    """`-o name`: kind.group/name, as kubectl prints it."""
    return f"{kind.kind.lower()}.{kind.group}/{name}"


def parse_target(target: str) -> tuple[str, str]:
    """impact's TYPE/NAME: ("pool" | "node", name)."""
    prefix, slash, name = target.partition("/")
    if slash and name and "/" not in name:
        if prefix.lower() in POOL_PREFIXES:
            return "pool", name
        if prefix.lower() in NODE_PREFIXES:
            return "node", name
    raise Failed(f'error: "{target}": name what to look at as pool/NAME (a NodeSummary, or its label value) '
                 "or node/NAME")


def pools_of(summaries: list[dict[str, Any]], name: str) -> list[str]:
    """The NodeSummaries ``name`` means: the one of that name, else those whose selector's label value
    it is (``gpu`` for gke-nodepool-gpu)."""
    names = [str(s["metadata"]["name"]) for s in summaries]
    if name in names:
        return [name]
    return [str(s["metadata"]["name"]) for s in summaries
            if name in (((s.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}).values()]


def pools_of_node(summaries: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """The NodeSummaries whose selector the node's labels match."""
    out = []
    for s in summaries:
        wanted = ((s.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if wanted and all(labels.get(k) == v for k, v in wanted.items()):
            out.append(str(s["metadata"]["name"]))
    return out


IMPACT_HEADERS = ["NAMESPACE", "NAME", "SHORT_TYPE", "POOL", "NODES", "UNHEALTHY_NODES", "N_PODS", "UNHEALTHY"]
IMPACT_WIDE = ["LONG_TYPE", "PLACEMENT"]


def impacted(summaries: list[dict[str, Any]], pools: Sequence[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(WorkloadSummary, its nodeSummaryRef) of every workload with pods in one of ``pools``: most
    unhealthy nodes of the pool first, then most nodes, then by namespace and name."""
    hits = []
    for item in summaries:
        refs = {r.get("name"): r for r in (item.get("status") or {}).get("nodeSummaryRefs") or []}
        hits += [(item, refs[pool]) for pool in pools if pool in refs]
    return sorted(hits, key=lambda hit: (-int(hit[1].get("unhealthyNodeCount") or 0),
                                         -int(hit[1].get("nodeCount") or 0),
                                         hit[0]["metadata"].get("namespace", ""), hit[0]["metadata"]["name"]))


def impact_rows(hits: list[tuple[dict[str, Any], dict[str, Any]]], wide: bool) -> tuple[list[str], list[list[str]]]:
    rows = []
    for item, ref in hits:
        status = item.get("status") or {}
        row = [item["metadata"].get("namespace", ""), item["metadata"]["name"], cell_text(status.get("shortType")),
               str(ref["name"]), cell_text(ref.get("nodeCount", 0)), cell_text(ref.get("unhealthyNodeCount", 0)),
               cell_text(status.get("podCount", 0)), cell_text(status.get("podsOnUnhealthyNodes", 0))]
        if wide:
            row += [cell_text(status.get("longType")), cell_text(status.get("placement"))]
        rows.append(row)
    return IMPACT_HEADERS + (IMPACT_WIDE if wide else []), rows


# -- flags -------------------------------------------------------------------------------------

EXAMPLES = """\
examples:
  kubectl nws workloads -A                 # every WorkloadSummary, whatever `kubectl get workloads` lists here
  kubectl nws workloads -n ml -o wide      # with each workload's placement over node pools
  kubectl nws pools                        # the NodeSummaries: nodes, readiness, allocatable, per pool
  kubectl nws impact pool/gke-nodepool-gpu # the workloads with pods in that pool, most affected first
  kubectl nws impact node/gke-gpu-7        # the same for the node's pool
  kubectl nws workloads -o yaml --context prod

The same objects through kubectl: kubectl get workloadsummaries.ux -A, kubectl get wls -A,
kubectl get nodesummaries, and every kind of this project: kubectl get nws -A.
"""


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """kubectl's usual flags, on the command and on each subcommand (kubectl's flags go anywhere).
    A subcommand's defaults are suppressed, so a flag given before it is not reset."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--kubeconfig", metavar="PATH", default=default(None),
                        help="the kubeconfig file (default: $KUBECONFIG, the in-cluster service account, "
                             "~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", default=default(None), help="the kubeconfig context to use")
    parser.add_argument("-n", "--namespace", metavar="NS", default=default(None),
                        help="the namespace (default: the context's)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", default=default(False),
                        help="every namespace")
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default(""),
                        help="wide: more columns; json, yaml: the objects; name: kind.group/name")
    parser.add_argument("--no-headers", action="store_true", default=default(False),
                        help="no header line in tables")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="node-workload-summary's summaries: workloads (WorkloadSummaries) and node pools "
                    "(NodeSummaries), kilobytes read whatever the cluster's size.")
    _common(top, suppress=False)
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in (
        ("workloads", "the WorkloadSummaries, with the columns of `kubectl get workloadsummaries`"),
        ("pools", "the NodeSummaries, with the columns of `kubectl get nodesummaries`"),
        ("impact", "the workloads with pods in a pool (pool/NAME) or in a node's pool (node/NAME), "
                   "from their summaries; every namespace unless -n"),
    ):
        sub = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _common(sub, suppress=True)
        if name == "impact":
            sub.add_argument("target", metavar="pool/NAME|node/NAME",
                             help="a NodeSummary by name (or its label value), or a Node")
    return top


def parse(argv: Sequence[str]) -> argparse.Namespace:
    return parser().parse_args(list(argv))


# -- the API -----------------------------------------------------------------------------------

async def _list(api: ApiClient, kind: Resource, namespace: str, accept: str, params: dict[str, str]) -> dict[str, Any]:
    """Every page of a LIST (kubectl's chunks of 500), as one answer: the first page's, rows or items joined."""
    merged: dict[str, Any] | None = None
    cont = ""
    path = kind.path(namespace if kind.namespaced else "")
    while True:
        query = {**params, "limit": str(PAGE), **({"continue": cont} if cont else {})}
        page = json.loads(await api.get(path, query, accept=accept, timeout=TIMEOUT))
        if merged is None:
            merged = page
        else:
            key = "rows" if page.get("kind") == "Table" else "items"
            merged[key] = (merged.get(key) or []) + (page.get(key) or [])
        cont = (page.get("metadata") or {}).get("continue") or ""
        if not cont:
            return merged


def _explain(err: ApiError, host: str, kind: Resource | None = None) -> str:
    """One line on what failed, and what to do about it."""
    from kubeindex.client.api import NotFound

    if err.status == 0:
        return (f"error: no answer from the API server at {host} ({err.reason}: {err.message}): is the cluster "
                "up, and are --context and --kubeconfig the right ones?")
    if isinstance(err, NotFound) and kind is not None:
        return (f"error: the server does not serve {kind.name} ({kind.api_version}): node-workload-summary's CRDs "
                "are not installed in this cluster (the Helm chart or `kubectl apply -k deploy/` installs them)")
    return f"Error from server ({err.reason or err.status}): {err.message}"


async def _run(args: argparse.Namespace, out: list[str], notes: list[str]) -> None:
    from kubeindex.client.api import (
        PARTIAL,
        ApiClient,
        ApiError,
        ConfigError,
        NotFound,
        context_namespace,
        load_connection,
    )

    try:
        connection = load_connection(args.kubeconfig, args.context)
        namespace = "" if args.all_namespaces else args.namespace or context_namespace(args.kubeconfig, args.context)
    except ConfigError as err:
        raise Failed(f"error: {err}") from None
    if args.command == "impact":
        what, name = parse_target(args.target)
        namespace = "" if args.all_namespaces or not args.namespace else args.namespace
    async with ApiClient(connection, max_connections=2) as api:
        kind: Resource | None = None
        try:
            if args.command in ("workloads", "pools"):
                kind = WORKLOADS if args.command == "workloads" else POOLS
                await _get(api, kind, namespace if kind.namespaced else "", args, out, notes)
            else:
                kind = POOLS
                summaries = (await _list(api, POOLS, "", "application/json", {}))["items"] or []
                if what == "pool":
                    pools = pools_of(summaries, name)
                    if not pools:
                        raise Failed(f'error: no NodeSummary "{name}", and none for that label value '
                                     "(kubectl nws pools lists them)")
                else:
                    kind = None
                    try:
                        node = json.loads(await api.get(NODES.path(name=name), accept=PARTIAL, timeout=TIMEOUT))
                    except NotFound:
                        raise Failed(f'Error from server (NotFound): nodes "{name}" not found') from None
                    pools = pools_of_node(summaries, (node.get("metadata") or {}).get("labels") or {})
                    if not pools:
                        raise Failed(f"error: node {name} is in no NodeSummary's pool (its labels match no "
                                     "NodeSummarizer's labelKey): the summaries say nothing of it")
                    notes.append(f"node {name} is in pool {', '.join(pools)}; the summaries count each workload's "
                                 "nodes per pool, not which: these workloads have pods in that pool, on this node "
                                 "or another")
                kind = WORKLOADS
                items = (await _list(api, WORKLOADS, namespace, "application/json", {}))["items"] or []
                hits = impacted(items, pools)
                if args.output in ("json", "yaml"):
                    out.append(dump(as_list([item for item, _ in hits], WORKLOADS), args.output))
                elif args.output == "name":
                    out += [object_name(WORKLOADS, item["metadata"]["name"]) + "\n" for item, _ in hits]
                elif hits:
                    headers, rows = impact_rows(hits, args.output == "wide")
                    out.append(render(None if args.no_headers else headers, rows))
                else:
                    notes.append(f"No workloads have pods in {', '.join(pools)}")
        except ApiError as err:
            raise Failed(_explain(err, connection.host, kind)) from None


async def _get(api: ApiClient, kind: Resource, namespace: str, args: argparse.Namespace, out: list[str],
               notes: list[str]) -> None:
    """`kubectl get` of one kind: the API server's Table, or the objects (-o json|yaml)."""
    if args.output in ("json", "yaml"):
        items = (await _list(api, kind, namespace, "application/json", {}))["items"] or []
        out.append(dump(as_list(items, kind), args.output))
        return
    table = await _list(api, kind, namespace, TABLE, {"includeObject": "Metadata"})
    rows = table.get("rows") or []
    if not rows:
        notes.append(nothing_found(namespace if kind.namespaced else ""))
        return
    if args.output == "name":
        out += [object_name(kind, str(((row.get("object") or {}).get("metadata") or {}).get("name") or row["cells"][0]))
                + "\n" for row in rows]
        return
    headers, cells = table_columns(table, args.output == "wide")
    if kind.namespaced and not namespace:
        headers = ["NAMESPACE", *headers]
        cells = [[row_namespace(row), *c] for row, c in zip(rows, cells, strict=True)]
    out.append(render(None if args.no_headers else headers, cells))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    notes: list[str] = []
    try:
        asyncio.run(_run(args, out, notes))
    except Failed as err:
        print(err, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    sys.stdout.write("".join(out))
    for note in notes:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
