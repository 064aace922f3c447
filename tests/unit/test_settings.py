"""Settings: what cannot work is refused at start, one line per problem, exit code 2; lists and
log levels are read the way people write them; --help reads like help. No cluster needed."""

from __future__ import annotations

import pytest

from node_workload_summary.main import main
from node_workload_summary.settings import Settings, load

NO_CLUSTER = "--kubeconfig=/nonexistent/kc"  # should a bad setting slip through, start fails fast


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"NWS_{name.upper()}", raising=False)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """The lines printed when main() refuses these flags (exit code 2)."""
    assert main([NO_CLUSTER, *args]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("error: --") for line in lines), lines
    return lines


def parse(*args: str) -> Settings:
    return load(args)


@pytest.mark.parametrize("flag", ["--lease-duration", "--renew-deadline", "--retry-period"])
@pytest.mark.parametrize("seconds", ["0.5", "0"])
def test_durations_below_one_second_are_refused(capsys: pytest.CaptureFixture[str], flag: str, seconds: str) -> None:
    assert refused(capsys, flag, seconds) == [f"error: {flag}: must be at least 1 s (got {seconds})"]


def test_lease_duration_is_whole_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    # Lease.spec.leaseDurationSeconds is an integer: 7.5 would silently become 7.
    assert refused(capsys, "--lease-duration", "7.5") == [
        "error: --lease-duration: must be a whole number of seconds, as the Lease stores it (got 7.5)"]
    settings = parse("--lease-duration", "20.0")
    assert settings.lease_duration == 20 and isinstance(settings.lease_duration, int)


def test_renew_deadline_must_be_shorter_than_the_lease(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, "--lease-duration", "5", "--renew-deadline", "5") == [
        "error: --renew-deadline: must be shorter than --lease-duration (got 5 s, lease 5 s)"]


def test_retry_period_must_fit_in_the_renew_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, "--renew-deadline", "4", "--retry-period", "4") == [
        "error: --retry-period: must be below --renew-deadline / 1.2 so a renewal can be retried in time "
        "(got 4 s, renew deadline 4 s)"]


def test_watch_timeout_min_above_max_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, "--watch-timeout-min", "700", "--watch-timeout-max", "600") == [
        "error: --watch-timeout-max: must not be below --watch-timeout-min (got 600, min 700)"]


def test_every_problem_gets_its_own_line(capsys: pytest.CaptureFixture[str]) -> None:
    lines = refused(capsys, "--port", "70000", "--retry-period", "0.1", "--watch-timeout-min", "0")
    assert [line.split(":")[1].strip() for line in lines] == ["--port", "--watch-timeout-min", "--retry-period"]


def test_env_errors_name_the_flag(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NWS_PORT", "abc")
    assert refused(capsys) == [
        "error: --port: Input should be a valid integer, unable to parse string as an integer "
        "(got 'abc' from NWS_PORT)"]


def test_defaults_are_valid() -> None:
    settings = parse()
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (15, 10.0, 2.0)
    assert settings.sync_loss_grace == 60.0 and settings.workload_pod_labels == []


@pytest.mark.parametrize("raw", ['["a","b"]', '[ "a", "b" ]', "a,b", " a , b ,", '["a", "b"]'])
def test_workload_pod_labels_json_or_commas(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    assert parse("--workload-pod-labels", raw).workload_pod_labels == ["a", "b"]
    monkeypatch.setenv("NWS_WORKLOAD_POD_LABELS", raw)
    assert parse().workload_pod_labels == ["a", "b"]


def test_workload_pod_labels_repeated_flag_and_real_keys() -> None:
    assert parse("--workload-pod-labels", "volcano.sh/job-name", "--workload-pod-labels",
                 "pod-group.scheduling.kubenexus.io/name").workload_pod_labels == [
        "volcano.sh/job-name", "pod-group.scheduling.kubenexus.io/name"]


def test_workload_pod_labels_broken_json_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    [line] = refused(capsys, "--workload-pod-labels", '["a", "b"')
    assert line.startswith("error: --workload-pod-labels: not a JSON list of strings")


@pytest.mark.parametrize("level", ["DEBUG", "Warning", "error"])
def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    assert parse("--log-level", level).log_level == level.lower()
    monkeypatch.setenv("NWS_LOG_LEVEL", level)
    assert parse().log_level == level.lower()


def test_help_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("--help")
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for noise in ("{str,null}", "list[str]", "default factory", " float", " int]", " int\n", " str]", " str\n"):
        assert noise not in text, noise
    for readable in ("--kubeconfig PATH", "--workload-pod-labels LABELS", "--lease-duration SECONDS",
                     "--port PORT", "--log-level {debug,info,warning,error}", "[env: NWS_SYNC_LOSS_GRACE]"):
        assert readable in text, readable


def test_metrics_secure_needs_a_probe_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, "--metrics-secure") == [
        "error: --metrics-secure: needs --probe-port, so that /healthz and /readyz answer without a token"]
    assert refused(capsys, "--probe-port=8080") == ["error: --probe-port: must differ from --port (got 8080)"]
    settings = parse("--metrics-secure", "--probe-port=8081")
    assert settings.metrics_secure and settings.probe_port == 8081


def test_metrics_certificate_and_key_go_together_and_only_when_secure(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, "--metrics-secure", "--probe-port=8081", "--metrics-cert-file=/c") == [
        "error: --metrics-key-file: --metrics-cert-file and --metrics-key-file go together (got only "
        "--metrics-cert-file)"]
    assert refused(capsys, "--metrics-cert-file=/c", "--metrics-key-file=/k") == [
        "error: --metrics-key-file: a certificate is only used with --metrics-secure"]


SEE_HELP = "See 'node-workload-summary --help' for usage."


@pytest.mark.parametrize("args,error", [
    (["--foo"], "error: unknown flag: --foo"),
    (["--foo=1", "--bar"], "error: unknown flags: --foo, --bar"),
    (["--po", "3"], "error: unknown flag: --po"),  # no abbreviations: --port or --probe-port?
    (["extra"], "error: unexpected argument 'extra': every setting is a flag (--name=value)"),
    (["--port"], "error: --port: expected one argument"),
], ids=["unknown", "two-unknown", "abbreviated", "positional", "no-value"])
def test_a_bad_command_line_says_so_in_one_line_and_points_to_help(capsys: pytest.CaptureFixture[str],
                                                                    args: list[str], error: str) -> None:
    """As kubectl: the error, then where the usage is; not the 40 lines of usage first."""
    assert main([NO_CLUSTER, *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [error, SEE_HELP] and captured.out == ""
