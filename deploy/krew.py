"""The krew release of `kubectl nws`: its archive and its plugin manifest, as the release workflow
makes them, checked against krew's rules.

    python -m deploy.krew --wheel dist/node_workload_summary-0.1.0-py3-none-any.whl \\
        --homepage https://github.com/OWNER/REPO --url https://github.com/OWNER/REPO/releases/download/v0.1.0 \\
        --out dist

writes ``dist/kubectl-nws-<version>.tar.gz`` and ``dist/nws.yaml`` (krew's index names a plugin's
manifest after the plugin), and fails when the manifest breaks a rule krew's own validation
enforces (``check``: the rules of sigs.k8s.io/krew's internal/index/validation and the fields of
its pkg/index types, as its plugin manifest guide documents them).

The plugin is Python: the archive holds the wheel and a launcher, ``kubectl-nws``, which makes a
virtual environment beside itself on first use (``python3 -m venv``, Python 3.11 or later) and
installs the wheel there with pip, its dependencies from the user's package index (pip's own
configuration: ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ...). One archive serves every platform.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "nws"
API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
OSES = ("linux", "darwin")  # any architecture: the archive holds no binary, the wheel is pure Python
SHORT = "Node pools and workloads from node-workload-summary's summaries"
DESCRIPTION = """\
Lists node-workload-summary's summaries: the root workloads (Deployments, JobSets,
LeaderWorkerSets, ...) with their pods and placement over node pools, the node pools with
their nodes' readiness and allocatable resources, and which workloads a pool or a node's
pool carries. It reads the WorkloadSummary and NodeSummary objects only: kilobytes, however
large the cluster. `kubectl get workloads` lists Kueue's Workloads, or the in-tree
scheduling.k8s.io ones, where those are served; `kubectl nws workloads` lists ours in
every cluster.

  kubectl nws workloads -A
  kubectl nws pools -o wide
  kubectl nws impact pool/gke-nodepool-gpu
"""
CAVEATS = """\
Needs python3 (3.11 or later, with venv) on PATH. The first run makes a virtual
environment in the plugin's directory and installs the plugin's wheel there with pip, its
dependencies from your package index. node-workload-summary must run in the cluster: the
plugin reads the summaries it writes.
"""

LAUNCHER = """\
#!/bin/sh
# kubectl-nws as krew installs it: the wheel beside this file, installed on first use into a virtual
# environment here (python3 -m venv, Python 3.11+; NWS_PYTHON names another interpreter), then run.
set -eu
python=${NWS_PYTHON:-python3}
self=$("$python" -c 'import os, sys; print(os.path.realpath(sys.argv[1]))' "$0")
here=$(dirname "$self")
venv="$here/venv"
if [ ! -f "$venv/.installed" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "error: kubectl nws needs Python 3.11 or later ($python is $("$python" -V 2>&1))" >&2; exit 1; }
  echo "kubectl nws: installing into $venv (once) ..." >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here"/node_workload_summary-*.whl >&2
  touch "$venv/.installed"
fi
exec "$venv/bin/python" -m node_workload_summary.kubectl "$@"
"""


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def archive(wheel: Path, out: Path) -> Path:
    """kubectl-nws-<version>.tar.gz: the launcher, the wheel and the license, reproducibly (fixed
    times and owners)."""
    path = out / f"kubectl-{PLUGIN}-v{version()}.tar.gz"

    def add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, 0
        tar.addfile(info, io.BytesIO(data))

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, f"kubectl-{PLUGIN}", LAUNCHER.encode(), 0o755)
        add(tar, wheel.name, wheel.read_bytes(), 0o644)
        add(tar, "LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644)
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))  # no time in the gzip header either
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(homepage: str, uri: str, digest: str) -> dict[str, Any]:
    """The plugin manifest: one archive (``uri``, its ``digest``) for Linux and macOS, any architecture."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Plugin",
        "metadata": {"name": PLUGIN},
        "spec": {
            "version": f"v{version()}",
            "homepage": homepage,
            "shortDescription": SHORT,
            "description": DESCRIPTION,
            "caveats": CAVEATS,
            "platforms": [{
                "selector": {"matchExpressions": [{"key": "os", "operator": "In", "values": list(OSES)}]},
                "uri": uri, "sha256": digest, "bin": f"kubectl-{PLUGIN}",
                "files": [{"from": f"kubectl-{PLUGIN}", "to": "."}, {"from": "*.whl", "to": "."},
                          {"from": "LICENSE", "to": "."}],
            }],
        },
    }


# What krew reads (pkg/index/types.go): anything else is a field it does not know.
_FIELDS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "spec": {"version", "shortDescription", "description", "caveats", "homepage", "platforms"},
    "platform": {"uri", "sha256", "selector", "files", "license", "bin"},
    "file": {"from", "to"},
    "selector": {"matchLabels", "matchExpressions"},
}
_SAFE_NAME = re.compile(r"^[\w-]+$")
_SHA256 = re.compile(r"^[a-f0-9]{64}$")
_SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
_WINDOWS = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def check(document: Any, file_name: str) -> list[str]:
    """What krew would refuse in this plugin manifest (named ``file_name`` in the index), one line
    each; [] when it validates."""
    problems: list[str] = []

    def unknown(where: str, obj: dict[str, Any], kind: str) -> None:
        problems.extend(f"{where}: unknown field {key!r}" for key in sorted(set(obj) - _FIELDS[kind]))

    if not isinstance(document, dict):
        return ["not a YAML mapping"]
    unknown("manifest", document, "")
    name = file_name.removesuffix(".yaml")
    if document.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion must be {API_VERSION}")
    if document.get("kind") != "Plugin":
        problems.append('kind must be "Plugin"')
    if not _SAFE_NAME.match(name) or name.upper() in _WINDOWS:
        problems.append(f"plugin name {name!r} is not allowed (must match {_SAFE_NAME.pattern})")
    if (document.get("metadata") or {}).get("name") != name:
        problems.append(f"metadata.name must be {name!r}, the manifest's file name")
    spec = document.get("spec") or {}
    unknown("spec", spec, "spec")
    short = spec.get("shortDescription") or ""
    if not short:
        problems.append("spec.shortDescription is required")
    if "\n" in short or "\r" in short:
        problems.append("spec.shortDescription must be one line")
    if not _SEMVER.match(str(spec.get("version") or "")):
        problems.append("spec.version must be a semantic version with a leading v")
    for key in ("description", "caveats", "homepage"):
        if key in spec and not isinstance(spec[key], str):
            problems.append(f"spec.{key} must be a string")
    platforms = spec.get("platforms") or []
    if not platforms:
        problems.append("spec.platforms must list at least one platform")
    for i, platform in enumerate(platforms):
        where = f"spec.platforms[{i}]"
        unknown(where, platform, "platform")
        if not platform.get("uri"):
            problems.append(f"{where}.uri is required")
        if not _SHA256.match(str(platform.get("sha256") or "")):
            problems.append(f"{where}.sha256 must be 64 lower-case hex digits")
        if not platform.get("bin"):
            problems.append(f"{where}.bin is required")
        files = platform.get("files")
        if files is not None and not files:
            problems.append(f"{where}.files must be absent or not empty")
        for j, op in enumerate(files or []):
            unknown(f"{where}.files[{j}]", op, "file")
            if not op.get("from") or not op.get("to"):
                problems.append(f"{where}.files[{j}] needs from and to")
        selector = platform.get("selector")
        if not selector:
            problems.append(f"{where}.selector is required and not empty")
            continue
        unknown(f"{where}.selector", selector, "selector")
        keys = set(selector.get("matchLabels") or {}) | {e.get("key") for e in selector.get("matchExpressions") or []}
        problems.extend(f"{where}.selector: key {key!r} not supported (os, arch)"
                        for key in sorted(keys - {"os", "arch"}, key=str))
        for k, expression in enumerate(selector.get("matchExpressions") or []):
            operator, values = expression.get("operator"), expression.get("values") or []
            if operator not in ("In", "NotIn", "Exists", "DoesNotExist") or \
                    bool(values) != (operator in ("In", "NotIn")):
                problems.append(f"{where}.selector.matchExpressions[{k}]: operator {operator!r} with values "
                                f"{values} is not a label selector requirement")
        for field in ("matchLabels", "matchExpressions"):
            if field in selector and not selector[field]:
                problems.append(f"{where}.selector.{field} is given but empty")
    return problems


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (``|``), as krew's example manifests write them."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.krew", description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the wheel of this release")
    parser.add_argument("--homepage", required=True, help="the project's home page")
    parser.add_argument("--url", required=True, help="where the release's files are downloaded from (a directory)")
    parser.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tar = archive(args.wheel, args.out)
    document = manifest(args.homepage, f"{args.url.rstrip('/')}/{tar.name}", sha256(tar))
    path = args.out / f"{PLUGIN}.yaml"
    path.write_text(dump(document))
    problems = check(yaml.safe_load(path.read_text()), path.name)
    for problem in problems:
        print(f"error: {path}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{tar}\n{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
