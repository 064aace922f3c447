"""Write dashboards/generated/*.json from dashboards/build.py.
--cluster-label LABEL names the label that tells clusters apart (default: cluster);
--multi-cluster shows the cluster variable (hidden by default, for one cluster)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from node_workload_summary import generated

from .build import DASHBOARDS, Options

OUT = Path(__file__).parent / "generated"


DEFAULT = Options()


def render(o: Options = DEFAULT) -> dict[str, str]:
    return {name: json.dumps(make(o).to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
            for name, make in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    # Our own options first; the rest (--out, --check, --help) is the shared generator's.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cluster-label", default=Options.cluster_label)
    parser.add_argument("--multi-cluster", action="store_true")
    args, rest = parser.parse_known_args(argv)
    o = Options(cluster_label=args.cluster_label, multi_cluster=args.multi_cluster)
    return generated.main(f"python -m {__package__}", __doc__, lambda: render(o), OUT, rest)


if __name__ == "__main__":
    sys.exit(main())
