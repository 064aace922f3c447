"""The README's commands. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_readme.py."""

from __future__ import annotations

import re

from tests.support.readme import README, SECTION, command_blocks, section, with_help


def test_the_try_it_section_has_the_setup_step_and_the_commands() -> None:
    blocks = command_blocks(section(SECTION))
    assert len(blocks) == 2, blocks
    setup, more = blocks
    assert [line.split("#")[0].strip() for line in setup.splitlines()] == ["make install", "make demo"]
    assert ".venv/bin/node-workload-summary --help" in more and ".venv/bin/node-workload-summary --version" in more
    assert with_help("make demo DEMO_ARGS=--pods   # x") == "make demo DEMO_ARGS='--pods --help'   # x"
    assert with_help("make demo      # y") == "make demo DEMO_ARGS=--help      # y"


def test_no_python_command_off_the_virtualenv() -> None:
    """In code spans and code blocks alike: `python -m x`, `python3 -m x` or `node-workload-summary`
    as a command is `.venv/bin/...` (a make target runs the virtualenv's itself)."""
    code = "\n".join([*re.findall(r"`([^`\n]+)`", README), *re.findall(r"^```\w*\n(.*?)^```$", README, re.M | re.S)])
    commands = [part.strip().removeprefix("$ ") for line in code.splitlines() for part in re.split(r"[;|]|&&", line)]
    bare = [command for command in commands if re.match(r"python3? -m \S|node-workload-summary\s+-", command)]
    assert bare == [], bare
    assert ".venv/bin/python -m bench.scale" in code and ".venv/bin/node-workload-summary --help" in code
