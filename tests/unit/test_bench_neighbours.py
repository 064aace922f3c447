"""bench/neighbours.py's pure parts: a failed soak says what failed (the last failed check's
differences, the deaths, the minutes over the write bound) and keeps the component logs where a
failed test keeps its own; the RSS of each process that ran, split where a container restarted
in place, with its slope after warm-up; the from-scratch capacity of the claim's flavor."""

from __future__ import annotations

from pathlib import Path

from bench.neighbours import WARM_UP, report_failure, rss_lives
from bench.neighbours_quota import FLAVOR, ready_capacity


def check(reason: str, ok: bool, failed: dict[str, list[str]] | None = None, t: float = 1.0) -> dict:
    return {"t": t, "reason": reason, "ok": ok, "failed": failed or {}}


def test_a_failure_names_the_last_failed_check_and_keeps_the_logs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "kube-apiserver.log").write_text("the API server's log\n")
    result = {"checks": [check("periodic", False, {"summaries": ["node/pool/a: want 3 got 2"]}, t=4),
                         check("stall", False, {"metrics b": ["nws_workload_pods/bench/app-0: want 5 got 4"],
                                                "quota": ["quota team-a/cpu: want 12 got 9600m"]}, t=9),
                         check("periodic", True, t=12)],
              "deaths": [{"identity": "b", "t": 30.0, "code": 1, "log": "/x/b.log"}],
              "minutes": [{"minute": 0, "writes": 9, "bound": 10, "ok": True},
                          {"minute": 1, "writes": 40, "bound": 12, "ok": False}]}
    lines = report_failure(result, "pods", logs, root=tmp_path / "kept")
    assert lines[0] == "FAILED: 2 of 3 checks"
    assert lines[1] == "the last failed check (stall, at 9 s):"
    assert lines[2:4] == ["    metrics b: nws_workload_pods/bench/app-0: want 5 got 4",
                          "    quota: quota team-a/cpu: want 12 got 9600m"]
    assert "death: b at 30 s (1); log /x/b.log" in lines
    assert "minute 1: 40 writes over the bound 12" in lines
    (kept,) = (tmp_path / "kept").iterdir()
    assert kept.name.startswith("bench.neighbours-pods-")
    assert (kept / "kube-apiserver.log").read_text() == "the API server's log\n"
    assert lines[-1] == f"component logs kept in {kept}"


def test_rss_per_process_with_its_slope_after_warm_up() -> None:
    mb = 1_000_000
    samples = [{"t": 60.0 * m, "identity": "a", "started": 100.0, "bytes": (70 + m) * mb} for m in range(1, 11)]
    # b's container restarted in place at minute 5: a new process, a new start time, a lower RSS
    samples += [{"t": 60.0 * m, "identity": "b", "started": 100.0, "bytes": 90 * mb} for m in range(1, 5)]
    samples += [{"t": 60.0 * m, "identity": "b", "started": 400.0, "bytes": 60 * mb} for m in range(5, 8)]
    lives = rss_lives(samples)
    assert [(life["identity"], life["minutes"]) for life in lives] == [("a", 9.0), ("b", 3.0), ("b", 2.0)]
    assert lives[0]["start_mb"] == 71 and lives[0]["end_mb"] == 80
    assert lives[0]["slope_mb_per_hour"] == 60.0  # 1 MB a minute, from WARM_UP on
    assert WARM_UP > 60 and lives[2]["slope_mb_per_hour"] is None  # too short a life after its warm-up


def node(name: str, pool: str, ready: str, cpu: str) -> dict:
    return {"metadata": {"name": name, "labels": {"pool": pool}},
            "status": {"allocatable": {"cpu": cpu, "memory": "1Gi"},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def test_the_flavor_capacity_is_its_ready_nodes_allocatable() -> None:
    nodes = [node("n1", FLAVOR, "True", "4"), node("n2", FLAVOR, "False", "8"), node("n3", FLAVOR, "Unknown", "8"),
             node("n4", "pool-1", "True", "16"), node("n5", FLAVOR, "True", "1500m")]
    assert ready_capacity(nodes, "pool") == {"cpu": 5_500_000_000, "memory": 2 * 1024**3 * 10**9}
