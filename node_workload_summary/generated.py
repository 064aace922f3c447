"""The generated files (dashboards, alert rules, deploy/ copies): write them, or tell whether the
committed ones are current."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def write(files: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
        print(out / name)


def stale(files: dict[str, str], out: Path) -> list[str]:
    """Names whose committed copy differs from a fresh render."""
    return [name for name, text in files.items() if not (out / name).exists() or (out / name).read_text() != text]


def main(prog: str, description: str | None, render: Callable[[], dict[str, str]], out: Path,
         argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--check", action="store_true", help="only tell whether the files are current (exit 1 if not)")
    args = parser.parse_args(argv)
    if args.check:
        names = stale(render(), args.out)
        for name in names:
            print(f"stale: {args.out / name}")
        return 1 if names else 0
    write(render(), args.out)
    return 0
