"""The chart's values reference (README.md) and values.schema.json, both from values.yaml and its
comments, written in helm-docs' style:

    # @schema {"minimum": 0}          optional, anywhere in the block: JSON Schema keywords to add
    # -- (type) What the value does,  the description starts at `# --`; `(type)` is optional
    # and its next lines.
    # @default -- what to show        optional: the README's default, instead of the value's JSON
    key: value

A key whose default is a non-empty map and whose comment gives no type is a section: its keys are
values of their own. Any other key is a value, and needs a `# --` description (a test checks). The
schema allows exactly the keys values.yaml has (a misspelt key fails `helm install`), typed as their
defaults are unless `(type)` says otherwise; a value whose type is `object` or `list` is free-form
(Kubernetes fields such as resources or affinity). Used by deploy/render.py."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*)\s*:(?:\s|$)")
# The README's type names (helm-docs') and their JSON Schema types.
TYPES: dict[str, str | list[str]] = {
    "bool": "boolean", "int": "integer", "float": "number", "string": "string", "list": "array",
    "object": "object", "int or string": ["integer", "string"],
}


@dataclass
class Value:
    path: str  # dotted, e.g. serviceMonitor.interval
    default: Any
    description: str = ""
    type: str = ""
    default_text: str = ""  # `@default --`, else the default's JSON
    schema: dict[str, Any] = field(default_factory=dict)  # `@schema` keywords

    @property
    def schema_type(self) -> str | list[str]:
        return TYPES[self.type]


def type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "string"


def _comment(block: list[str], value: Value) -> None:
    """Fill ``value`` from the comment lines above its key (their text after ``#``)."""
    start = max((i for i, line in enumerate(block) if line.startswith("--")), default=None)
    for line in block:
        if line.startswith("@schema "):
            value.schema.update(json.loads(line.removeprefix("@schema ")))
    if start is None:
        return
    lines = []
    for line in block[start:]:
        if line.startswith("@default --"):
            value.default_text = line.removeprefix("@default --").strip()
        elif not line.startswith("@schema "):
            lines.append(line)
    text = " ".join(lines).removeprefix("--").strip()
    typed = re.match(r"\((?P<type>[^)]+)\)\s*(?P<rest>.*)", text)
    if typed:
        value.type, text = typed["type"], typed["rest"]
    value.description = text


def parse(text: str) -> tuple[list[Value], set[str]]:
    """The values, in file order, and the section paths."""
    data = yaml.safe_load(text)
    values: list[Value] = []
    sections: set[str] = set()
    stack: list[tuple[int, str]] = []  # the sections around the current line: (indent, key)
    block: list[str] = []  # the comment lines just above
    inside: int | None = None  # the indent of the value whose lines (a list or map) these are
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            block = []
            continue
        indent = len(line) - len(line.lstrip(" "))
        if stripped.startswith("#"):
            block.append(stripped.removeprefix("#").strip())
            continue
        match = KEY.match(line)
        if inside is not None:
            if match is None or indent > inside:
                block = []
                continue  # a line of the value above (a list item, a nested key)
            inside = None
        if match is None:
            raise ValueError(f"values.yaml: not a key: {line!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [match["key"]]
        default: Any = data
        for key in path:
            default = default[key]
        value = Value(".".join(path), default)
        _comment(block, value)
        block = []
        if isinstance(default, dict) and default and not value.type:
            stack.append((indent, match["key"]))
            sections.add(value.path)
            continue
        value.type = value.type or type_of(default)
        if value.type not in TYPES:
            raise ValueError(f"values.yaml: {value.path}: unknown type ({value.type})")
        values.append(value)
        inside = indent
    return values, sections


def undocumented(values: list[Value]) -> list[str]:
    return [v.path for v in values if not v.description]


def schema(text: str) -> dict[str, Any]:
    """values.schema.json: JSON Schema draft-07 (Helm 3's validator reads up to draft-07, Helm 4's
    later drafts too)."""
    values, sections = parse(text)
    by_path = {v.path: v for v in values}

    def node(path: str, default: Any) -> dict[str, Any]:
        if path in sections:
            return {"type": "object", "additionalProperties": False,
                    "properties": {k: node(f"{path}.{k}", v) for k, v in default.items()}}
        value = by_path[path]
        out: dict[str, Any] = {"type": value.schema_type, "description": value.description}
        return {**out, **value.schema}

    data = yaml.safe_load(text)
    properties = {k: node(k, v) for k, v in data.items()}
    # An umbrella chart passes `global` to its subcharts.
    properties["global"] = {"type": "object", "description": "Values an umbrella chart shares with its subcharts."}
    return {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "additionalProperties": False, "properties": properties}


def schema_json(text: str) -> str:
    return json.dumps(schema(text), indent=2) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def readme(values_text: str, chart: dict[str, Any], header: str) -> str:
    """The chart's README.md: what it installs, how, and every value."""
    values, _ = parse(values_text)
    rows = []
    for v in values:
        default = v.default_text or f"`{json.dumps(v.default, separators=(',', ':'))}`"
        rows.append(f"| `{v.path}` | {v.type} | {_cell(default)} | {_cell(v.description)} |")
    return f"""<!-- {header.strip().removeprefix('# ')} Its source: values.yaml's `# --` comments. -->
# {chart['name']}

Version {chart['version']}, appVersion {chart['appVersion']}, Kubernetes `{chart['kubeVersion']}`.

{chart['description']}

```sh
helm install node-workload-summary <this chart> \\
  --namespace node-workload-summary --create-namespace -f my-values.yaml
```

One release per cluster: the CRDs, the ClusterRoles and the summaries are cluster-wide, and object
names are fixed (`node-workload-summary`). The CRDs are in `crds/`: Helm installs them before
anything else and never upgrades them, so before `helm upgrade` to a chart whose CRDs changed, run
`kubectl apply --server-side --force-conflicts -f crds/` from the chart's directory. The
repository's docs/deploy.md has the rest: metrics over HTTPS, the NetworkPolicy, the CRDs on
upgrade, what the tests prove.

## Values

Generated from values.yaml; `helm install` checks given values against values.schema.json, so a
misspelt key fails instead of being ignored.

| Key | Type | Default | Description |
|-----|------|---------|-------------|
""" + "\n".join(rows) + "\n"
