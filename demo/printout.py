"""The demo's printout as the docs show it: README.md's (up to "Ready in"), docs/localkube.md's
(whole, to the stop). Both are a real run's, written here; tests/cluster/test_demo.py checks its own run
against them, modulo what changes from run to run: seconds, ports, paths.

    .venv/bin/python -m demo.printout          # runs `python -m demo --duration 1`, rewrites both samples
    .venv/bin/python -m demo.printout --check  # only tell whether a fresh run still matches them
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LOCALKUBE = ROOT / "docs" / "localkube.md"
# Each doc's sample: the first plain ``` block after this heading.
HEADINGS = {README: "## Try it locally: the demo", LOCALKUBE: "## The demo's printout"}
READY = re.compile(r"^Ready in \d+s\.$", re.M)
# What changes from run to run, and what it becomes (in this order).
VARYING = (
    (re.compile(r"\S*/localkube-[^/\s]+"), "<workdir>"),         # the control plane's working directory
    (re.compile(r"\S*/nws-demo-[^/\s]+"), "<logs>"),             # where the logs are kept
    (re.compile(r"\S*/kubernetes-v[^/\s]+"), "<bin>"),           # the binaries' cache (its hash: the toolchain's)
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"node-workload-summary-\d+\.log"), "node-workload-summary-<port>.log"),
    (re.compile(r"--quota-settle=\d+(\.\d+)?"), "--quota-settle=<n>"),
    (re.compile(r"\b(\d+m)?\d+s\b"), "<n>s"),                    # Ready in 18s, the AGE columns
)


def normalized(text: str) -> str:
    for pattern, replacement in VARYING:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def without_story(printout: str) -> str:
    """The printout as a run without --quota-story prints it."""
    return re.sub(r"\n### claim .*?(?=\nPress Ctrl-C)", "", printout, flags=re.S)


def readme_part(printout: str) -> str:
    """What the README shows: from the start to "Ready in ...s."."""
    match = READY.search(printout)
    if match is None:
        raise ValueError(f"no 'Ready in' line:\n{printout}")
    return printout[:match.end()]


FENCED = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def _block(markdown: str, heading: str) -> tuple[int, int]:
    """Start and end offsets of the sample's text: the first plain ``` block (no language) after
    ``heading``."""
    for block in FENCED.finditer(markdown, markdown.index(f"\n{heading}\n")):
        if not block[1]:
            return block.start(2), block.end(2)
    raise ValueError(f"no plain ``` block after {heading!r}")


def sample(markdown: str, heading: str) -> str:
    start, end = _block(markdown, heading)
    return markdown[start:end]


def with_sample(markdown: str, heading: str, text: str) -> str:
    start, end = _block(markdown, heading)
    return markdown[:start] + text.strip("\n") + "\n" + markdown[end:]


def samples(printout: str) -> dict[Path, str]:
    """Each doc's sample of this printout (one without the story)."""
    return {README: readme_part(printout), LOCALKUBE: printout}


def stale(printout: str) -> list[str]:
    """The docs whose sample differs from this printout, modulo seconds, ports and paths."""
    printout = without_story(printout)
    return [path.name for path, text in samples(printout).items()
            if normalized(sample(path.read_text(), HEADINGS[path])) != normalized(text)]


def run_demo() -> str:
    """`python -m demo --duration 1`: its whole printout (stderr's [demo] lines in their place)."""
    proc = subprocess.run([sys.executable, "-m", "demo", "--duration", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"python -m demo failed (exit {proc.returncode}):\n{proc.stdout}")
    kept = re.search(r"^\[demo\] logs kept in (\S+)/ ", proc.stdout, re.M)
    if kept:  # this run's logs: not needed once its printout is read
        shutil.rmtree(kept[1], ignore_errors=True)
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.printout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only tell whether the samples match a fresh run")
    args = parser.parse_args(argv)
    printout = run_demo()
    if args.check:
        names = stale(printout)
        for name in names:
            print(f"stale: {name}")
        return 1 if names else 0
    for path, text in samples(printout).items():
        path.write_text(with_sample(path.read_text(), HEADINGS[path], text))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
