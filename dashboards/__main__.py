"""Write dashboards/generated/*.json from dashboards/build.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from node_workload_summary import generated

from .build import DASHBOARDS

OUT = Path(__file__).parent / "generated"


def render() -> dict[str, str]:
    return {name: json.dumps(make().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
            for name, make in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    return generated.main(f"python -m {__package__}", __doc__, render, OUT, argv)


if __name__ == "__main__":
    sys.exit(main())
