"""Write dashboards/generated/*.json from dashboards/build.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from .build import DASHBOARDS

OUT = Path(__file__).parent / "generated"


def render() -> dict[str, str]:
    return {name: json.dumps(make().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
            for name, make in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
