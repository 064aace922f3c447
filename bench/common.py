"""What the benchmarks share: where results go (--out), progress output, one percentile, and the
process, service and checkout helpers several of them use. Nothing here measures by itself, and
no bench module is imported here, so any bench can import it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kubeindex.model.resources import NODE_SUMMARIES, SUMMARIES, WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster
from localkube.service import Service, parse, select, wait_for

ROOT = Path(__file__).resolve().parent.parent  # the checkout
RESULTS = ROOT / "bench" / "results"  # every bench's reports, by default
CRDS = ROOT / "crds"
TICKS = 100  # clock ticks per second (USER_HZ) in /proc/<pid>/stat


# What a bench writes beside its JSON results, under the same name.
BESIDE = {".md": "the Markdown table", ".png": "the plot"}


def json_path(text: str) -> Path:
    """--out's type: a .json path, so that the .md and .png beside it cannot overwrite it."""
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"{text}: not a .json path (e.g. /tmp/{path.name or 'run'}.json)")
    return path


def add_out(parser: argparse.ArgumentParser, name: str, beside: tuple[str, ...] = ()) -> None:
    """--out, one meaning in every bench: the JSON file of the results, ``bench/results/<name>``
    by default; ``beside``: the files (.md, .png) written next to it under the same name."""
    parts = ["the results to PATH.json", *(f"{BESIDE[suffix]} to PATH{suffix}" for suffix in beside)]
    what = f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else parts[0]
    parser.add_argument("--out", type=json_path, default=RESULTS / name, metavar="PATH.json",
                        help=f"write {what} (default: bench/results/{name})")


def write_results(out: Path, result: object, table: str) -> None:
    """The results as JSON to ``out`` and the Markdown table beside it (``.md``); the table printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)


def run_and_write(parser: argparse.ArgumentParser, argv: list[str] | None,
                  run: Callable[[argparse.Namespace], dict], markdown: Callable[[dict], str]) -> int:
    """A bench's main: its arguments, its run, then its results and table (``write_results``)."""
    args = parser.parse_args(argv)
    result = run(args)
    write_results(args.out, result, markdown(result))
    return 0


def sayer(tag: str) -> Callable[[str], None]:
    """A progress printer: ``[tag] message`` on stderr, so that stdout keeps the results."""
    def say(msg: str) -> None:
        print(f"[{tag}] {msg}", file=sys.stderr, flush=True)

    return say


say = sayer("bench")


# -- percentiles -----------------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of ``values`` by nearest rank: the sorted values' item at index
    round(q * (n - 1)), so 0 is the least and 1 the greatest. None for no values: nothing was
    measured (every check failed, no round ran), which a 0 would report as instant."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is not between 0 and 1")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[round(q * (len(ordered) - 1))]


def percentile_ms(seconds: Iterable[float], q: float, digits: int | None = None) -> float | None:
    """percentile() of durations in seconds, in milliseconds rounded to ``digits`` decimals (whole
    milliseconds by default); None for no values."""
    value = percentile(seconds, q)
    return None if value is None else round(value * 1000, digits)


def p50_p99_ms(seconds: list[float]) -> tuple[float | None, float | None]:
    """p50 and p99 (percentile()) of durations in seconds, in whole milliseconds."""
    return percentile_ms(seconds, 0.5), percentile_ms(seconds, 0.99)


# -- processes, from /proc ------------------------------------------------------------------------

def control_plane_pids(cluster: LocalCluster, *names: str) -> dict[str, int]:
    """The pids of these running control plane processes, by short name: "apiserver" is
    kube-apiserver, any other name the process of that name ("etcd")."""
    pids = {}
    for name in names:
        pid = cluster.processes["kube-apiserver" if name == "apiserver" else name].pid
        assert pid is not None, f"{name} is not running"
        pids[name] = pid
    return pids


def status_kb(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM, ...); 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime


class Sampler(threading.Thread):
    """Peak VmRSS of some processes, every 100 ms, until stopped: VmHWM cannot be reset, so a
    peak during one phase of a long-lived process is sampled."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {name: 0 for name in pids}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], status_kb(pid, "VmRSS"))
            self._done.wait(0.1)

    def stop(self) -> dict[str, int]:
        self._done.set()
        self.join()
        return self.peak


# -- the service and its summaries ----------------------------------------------------------------

def writes(svc: Service) -> float:
    """The reconciler's writes so far (every verb)."""
    return sum(select(parse(svc.get("/metrics")[1]), "nws_reconciler_writes_total").values())


def writes_settled(svc: Service, summaries: int, quiet: float = 5, timeout: float = 900) -> float:
    """Wait until the reconciler has written every summary (an apply and a status apply each) and
    then nothing for ``quiet`` seconds: what is measured next must not queue behind (nor pay
    for) the first summaries. The seconds waited."""
    started = time.monotonic()
    last, since = writes(svc), time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(1)
        now = writes(svc)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= 2 * summaries and time.monotonic() - since >= quiet:
            break
    return time.monotonic() - started


def clean(cluster: LocalCluster) -> None:
    """Delete the summaries a previous service run wrote, so the next one starts as the first did
    (one DELETE of the collection per namespace: `kubectl delete --all` takes one request each)."""
    _, listed = cluster.request("/api/v1/namespaces")
    assert isinstance(listed, dict)
    for ns in [item["metadata"]["name"] for item in listed["items"]]:
        cluster.request(WORKLOAD_SUMMARIES.path(ns), "DELETE")
    cluster.request(NODE_SUMMARIES.path(), "DELETE")

    def gone() -> bool:
        for resource in SUMMARIES:
            _, listed = cluster.request(f"{resource.path()}?limit=1")
            assert isinstance(listed, dict)
            if listed["items"]:
                return False
        return True

    wait_for(gone, timeout=900, interval=1)


# -- checkouts (a before/after comparison on one control plane) -----------------------------------

@contextlib.contextmanager
def running_from(code: Path) -> Iterator[None]:
    """Processes started inside run the service's code from ``code`` (a checkout)."""
    cwd, path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(code)
    os.environ["PYTHONPATH"] = str(code)
    try:
        yield
    finally:
        os.chdir(cwd)
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path


def revision(code: Path) -> str:
    """The short commit a checkout is at."""
    return subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
