"""bench/common.py: the percentile every bench reports with (nearest rank, and None, not an
IndexError nor a 0 that reads as instant, when nothing was measured), and the --out every bench
script has."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.common import RESULTS, add_out, p50_p99_ms, percentile, percentile_ms


def test_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 1) == 5.0
    assert percentile(values, 0.99) == 5.0  # round(0.99 * 4) = 4
    assert percentile(values, 0.3) == 2.0  # round(1.2) = 1
    assert percentile(range(101), 0.99) == 99


def test_one_value_is_every_percentile() -> None:
    assert {percentile([0.25], q) for q in (0, 0.5, 0.99, 1)} == {0.25}


def test_no_values_no_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile_ms([], 0.99, 1) is None
    assert p50_p99_ms([]) == (None, None)


def test_milliseconds() -> None:
    assert p50_p99_ms([0.0104, 0.0206, 0.5]) == (21, 500)
    assert percentile_ms([0.01234], 0.5, 1) == 12.3


def test_a_quantile_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        percentile([1.0], 99)
    with pytest.raises(ValueError):
        percentile([1.0], -0.5)


def test_out_is_a_json_path_with_its_table_and_plot_beside_it() -> None:
    parser = argparse.ArgumentParser()
    add_out(parser, "x.json", (".md", ".png"))
    assert parser.parse_args([]).out == RESULTS / "x.json"
    assert parser.parse_args(["--out", "/tmp/run.7.json"]).out.with_suffix(".md") == Path("/tmp/run.7.md")
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "run"])  # a name, as --out once meant in two benches
    assert "the Markdown table to PATH.md and the plot to PATH.png" in " ".join(parser.format_help().split())
