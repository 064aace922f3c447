"""What both halves of test_readme (tests/unit and tests/cluster) use."""

from __future__ import annotations

import re
import shlex

from tests.paths import ROOT

README = (ROOT / "README.md").read_text()


SECTION = "## Try it locally: the demo"


MAKE_DEMO = re.compile(r"^make demo(?: DEMO_ARGS=(\S+))?(?=\s|$)")


def section(heading: str) -> str:
    start = README.index(f"\n{heading}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def command_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, re.M | re.S)


def with_help(block: str) -> str:
    """The block with `--help` added to each `make demo` line's DEMO_ARGS."""
    def line(text: str) -> str:
        match = MAKE_DEMO.match(text)
        if match is None:
            return text
        args = " ".join(filter(None, (match[1], "--help")))
        return f"make demo DEMO_ARGS={shlex.quote(args)}" + text[match.end():]
    return "\n".join(line(text) for text in block.splitlines())
