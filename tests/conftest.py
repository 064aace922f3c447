"""Shared fixtures: the local control plane (built from Go modules on first use) with the CRDs."""

from __future__ import annotations

import re
import shutil
import ssl
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from demo import kueue
from localkube.build import BENCH_ONLY, HELM, TEST_TOOLS, BackgroundBuild, Component, core, ensure_binaries
from localkube.cluster import LocalCluster, Options, leftover_processes
from localkube.controllers import Controller
from localkube.karpenter import KarpenterController, apply, node_class
from localkube.pki import generate
from tests.kube import leaves_nothing
from tests.paths import CRDS, FAILED_LOGS

# Fixtures both halves of a split module use (tests/unit, tests/cluster), defined once.
pytest_plugins = ("tests.support.wheel",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # One marker for everything that needs the local control plane: a test whose fixture closure
    # (item.fixturenames: the fixtures it asks for and every fixture those depend on) holds
    # `binaries` is marked `cluster`, so `-m 'not cluster'` (make unit) starts none. Every cluster
    # fixture depends on `binaries`; a test that starts a control plane itself asks for it too.
    # Likewise `karpenter` for every test beside the real Karpenter (the `karpenter` fixture): make test
    # leaves them out (-m 'not karpenter'), make test-karpenter runs them.
    for item in items:
        if "binaries" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        if "karpenter" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.karpenter)
    # A test's folder says what it needs: tests/unit holds none that starts a control plane.
    misplaced = [item.nodeid for item in items
                 if item.nodeid.startswith("tests/unit/") and item.get_closest_marker("cluster")]
    if misplaced:
        raise pytest.UsageError(f"these need a control plane: move them to tests/cluster/: {misplaced}")
    if config.getoption("prebuild"):
        # The modules that need what is built in the background run last, in the order it is
        # built (a stable sort: by file name within each group): the first tests overlap the
        # builds instead of waiting for them.
        items.sort(key=_built_by)


def _built_by(item: pytest.Item) -> int:
    """Where the last of the components the test's module needs (``pytest.mark.needs``) is in
    the background build's order; 0: needs none of them."""
    needs: list[Component] = [c for marker in item.iter_markers("needs") for c in marker.args]
    return max((TEST_TOOLS.index(c) + 1 for c in needs), default=0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--prebuild", action="store_true",
                     help="build the tools later tests need (helm, the Prometheus Operator, ...) in the "
                          "background, at the lowest CPU priority, while the first tests run (make test)")
    parser.addoption("--kubernetes", metavar="MINOR", default="",
                     help="run against kube-apiserver and kubectl of this Kubernetes minor (one of "
                          "localkube.build.COMPAT_MINORS) instead of the pinned one; with -m compat: make compat")
    parser.addoption("--kueue", metavar="CELL", default=kueue.NEWEST, choices=list(kueue.CELLS),
                     help=f"the Kueue the tests install (demo/kueue.py's cells: {', '.join(kueue.CELLS)}; default "
                          f"{kueue.NEWEST}); with -m kueue: make test-kueue-matrix")


def pytest_configure(config: pytest.Config) -> None:
    # Before collection: the test modules read the cell (its API version, its controller) at import.
    kueue.select(config.getoption("kueue"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    minor = config.getoption("kubernetes")
    cell = kueue.cell()
    return [f"kubernetes: {minor or 'the pinned version'} (kube-apiserver, kubectl)",
            f"kueue: {cell.name} (serving {', '.join(cell.served)})"]


def pytest_collection_finish(session: pytest.Session) -> None:
    # On a fresh machine their builds take minutes, spent behind tests that mostly wait on the
    # control plane instead of in front of the tests that need them.
    if session.config.getoption("prebuild") and any(item.get_closest_marker("cluster") for item in session.items):
        needed = {c for item in session.items for marker in item.iter_markers("needs") for c in marker.args}
        tools = tuple(c for c in TEST_TOOLS if c not in BENCH_ONLY or c in needed)
        session.config.stash[BACKGROUND] = BackgroundBuild(tools).start()


BACKGROUND = pytest.StashKey[BackgroundBuild]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    background = session.config.stash.get(BACKGROUND, None)
    if background is not None:
        background.stop()
        for failure in background.failed:
            print(f"\nbackground build failed (the tests that needed it built it again): {failure}")
    left = leftover_processes()
    if left:
        print(f"\nERROR: control plane processes left behind: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test keeps the logs of every control plane it used (kube-apiserver, the service
    processes, ...) in .test-logs/<test>/: a flake seen once can be read afterwards."""
    report = yield
    if report.failed and report.when != "teardown":
        args = getattr(item, "funcargs", {}).values()
        clusters = [v for v in args if isinstance(v, LocalCluster)]
        clusters += [v.cluster for v in args if isinstance(v, Controller) and v.cluster not in clusters]
        for n, cluster in enumerate(clusters):
            dest = FAILED_LOGS / re.sub(r"[^\w.-]+", "_", item.nodeid) / str(n)
            if (cluster.workdir / "logs").is_dir():
                shutil.copytree(cluster.workdir / "logs", dest, dirs_exist_ok=True)
                report.sections.append(("component logs", f"kept in {dest}"))
    return report


@pytest.fixture(scope="session")
def binaries(pytestconfig: pytest.Config) -> dict[str, Path]:
    """etcd, kube-apiserver and kubectl (of ``--kubernetes``'s minor, if given); a LocalCluster
    builds (or waits for) what else its options need."""
    return ensure_binaries(core(pytestconfig.getoption("kubernetes")))


@pytest.fixture(scope="session")
def control_plane(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """etcd + kube-apiserver with this project's CRDs, started once for every module that needs no
    flags and no cluster-wide state of its own. Tests take it through ``cluster``."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        yield c


@pytest.fixture(scope="module")
def cluster(control_plane: LocalCluster) -> Iterator[LocalCluster]:
    """The session's control plane for one module, which deletes what the module added when it
    ends (see tests.kube.leaves_nothing): no module sees another's objects, whatever the order."""
    with leaves_nothing(control_plane):
        yield control_plane


@pytest.fixture(scope="module")
def karpenter(binaries: dict[str, Path]) -> Iterator[KarpenterController]:
    """The real Karpenter (its KWOK provider and CRDs, built on first use: make test-karpenter) on a
    control plane of the module's own, with kube-controller-manager, kube-scheduler, KWOK, this
    project's CRDs, and KWOKNodeClass `default`; each test makes its NodePools (tests.karpenter.pool)."""
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as c:
        c.install_crds(CRDS)
        with KarpenterController(c) as controller:
            apply(c, node_class("default"))
            yield controller


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The helm command, built from its pinned Go module on first use, with its own home dirs."""
    home = tmp_path_factory.mktemp("helm-home")
    dirs = [f"{var}={home / var.lower()}" for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")]
    return ["env", *dirs, str(ensure_binaries((HELM,))["helm"])]


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS contexts of a fresh CA, for loopback servers in tests."""
    pki = generate(Path(tmp_path_factory.mktemp("pki")))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.serving_cert, pki.serving_key)
    return server, ssl.create_default_context(cafile=str(pki.ca_cert))
