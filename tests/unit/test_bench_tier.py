"""bench/tier.py's arithmetic, with no cluster: the slopes between the last two sizes, the
projection to a larger cluster, where a curve meets its limit, and what is left out."""

from __future__ import annotations

from bench.tier import CURVES, lookup, projections


def row(nodes: int, service_rss: float, etcd_db: float, apiserver: float) -> dict:
    return {"nodes": nodes, "pods": nodes * 15, "etcd_db_mb": etcd_db,
            "apiserver_peak_rss_during_service_mb": apiserver, "service": {"peak_rss_mb": service_rss}}


def test_slope_is_taken_between_the_last_two_sizes_and_projected() -> None:
    rows = [row(1000, 100, 50, 900), row(5000, 200, 400, 2000), row(10000, 400, 900, 4000)]
    got = {p["curve"]: p for p in projections(rows, 65000)}
    rss = got["service peak RSS (MB)"]
    assert rss["slope_per_1000_nodes"] == 40.0  # (400 - 200) / 5 thousand nodes, not the first pair's 25
    assert rss["projected"] == 400 + 40 * 55
    assert rss["at"] == {1000: 100, 5000: 200, 10000: 400}
    assert rss["meets_limit_at_nodes"] == 10000 + round((1024 - 400) / 0.04)
    db = got["etcd database (MB)"]
    assert db["meets_limit_at_nodes"] == 10000 + round((8192 - 900) / 0.1)


def test_curves_without_data_or_falling_have_no_crossing() -> None:
    rows = [row(1000, 300, 50, 900), row(2000, 250, 50, 900)]
    got = {p["curve"]: p for p in projections(rows, 65000)}
    assert got["service peak RSS (MB)"]["meets_limit_at_nodes"] is None  # falling: never
    assert "service initial sync (s)" not in got  # not measured in these rows
    assert projections(rows[:1], 65000) == []  # one size: no slope


def test_every_curve_path_resolves_in_a_full_row() -> None:
    full = {"nodes": 1, "apiserver_peak_rss_during_service_mb": 1, "etcd_rss_mb": 1, "etcd_db_mb": 1,
            "list_floor_seconds": 1, "kubectl": {"pods": {"seconds": 1, "kubectl_peak_rss_mb": 1}},
            "service": {"peak_rss_mb": 1, "initial_sync_seconds": 1, "scrape": {"bytes": 1},
                        "latency": {"metric_p99_ms": 1, "floor_p99_ms": 1}}}
    assert all(lookup(full, path) == 1 for _, path, _, _ in CURVES)
