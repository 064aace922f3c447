"""deploy/ as files. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_deploy.py."""

from __future__ import annotations

from node_workload_summary import generated
from tests.paths import ROOT


def test_generated_deploy_files_are_current() -> None:
    from deploy.render import OUT, render

    assert generated.stale(render(), OUT) == [], "run `make generate`"


def test_dockerfile_is_multi_stage_and_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("FROM ") == 2 and "-slim" in text and "USER 65532" in text
    # The runtime stage takes only the wheel from the build stage (mounted: it leaves no layer).
    runtime = text.rsplit("FROM ", 1)[1]
    assert "from=build,source=/dist" in runtime and "COPY" not in runtime and "*.whl" in runtime
