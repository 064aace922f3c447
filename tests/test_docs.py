"""docs/ documents every metric family and every setting the code has."""

from __future__ import annotations

import exporter.metrics as metrics
from node_workload_summary.settings import Settings
from tests.conftest import ROOT

METRICS = (ROOT / "docs" / "metrics.md").read_text()
SETTINGS = (ROOT / "docs" / "settings.md").read_text()


def _families() -> list[metrics.Family]:
    singles = [v for v in vars(metrics).values() if isinstance(v, metrics.Family)]
    return [*metrics.GROUP_FAMILIES, *metrics.WORKLOAD_FAMILIES, *singles]


def test_every_metric_family_is_documented() -> None:
    families = _families()
    assert len(families) > 20
    for family in families:
        name = metrics.PREFIX + family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in METRICS, name


def test_every_setting_is_documented() -> None:
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in SETTINGS and f"`NWS_{name.upper()}`" in SETTINGS, name
