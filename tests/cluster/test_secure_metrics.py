"""--metrics-secure on the local control plane: /metrics over HTTPS, only for bearer tokens whose
user may `get /metrics` (TokenReview + SubjectAccessReview, as the shipped reader ClusterRole
grants); the probes stay plain HTTP on a port of their own; a real Prometheus scrapes it with a
token file and a CA file and the NotReady alert still fires; a scrape storm costs a handful of
TokenReviews (counted in the API server's audit log); a flood of made-up tokens costs the API
server no more reviews than the bound, while a reader scrapes from cache as fast as before. The
Authorizer's bound and caches (on a fake clock) and the certificate reload are also checked
without a cluster."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shutil
import ssl
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest
import yaml

from alerts.rules import Thresholds, rules_file
from demo.workloads import node_summarizer
from exporter.auth import REVIEW_BURST, REVIEWS_PER_SECOND
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import Prometheus
from localkube.service import Samples, Service, metrics_reader_token, parse, value, wait_for
from tests.kube import AuditedCluster, create_node, set_node_status
from tests.paths import CRDS
from tests.support.secure_metrics import SCRAPES, openssl_cert

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditedCluster]:
    """A control plane whose audit log records every TokenReview and SubjectAccessReview."""
    audit = tmp_path_factory.mktemp("audit")
    (audit / "policy.yaml").write_text(yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "resources": [{"group": "authentication.k8s.io", "resources": ["tokenreviews"]},
                                                       {"group": "authorization.k8s.io",
                                                        "resources": ["subjectaccessreviews"]}]},
                  {"level": "None"}]}))
    options = Options(extra_apiserver_args=[f"--audit-policy-file={audit / 'policy.yaml'}",
                                            f"--audit-log-path={audit / 'audit.log'}"])
    with AuditedCluster(options, binaries, audit / "audit.log") as c:
        c.install_crds(CRDS)
        node_summarizer(c, "pool", "pool")
        for name in ("a-1", "a-2"):
            create_node(c, name, {"pool": "a"})
        metrics_reader_token(c, "reader")  # bound to the shipped metrics-reader role
        c.kubectl("create", "serviceaccount", "stranger")
        yield c


def token(kube: LocalCluster, sa: str) -> str:
    return kube.kubectl("create", "token", sa, "--duration=1h").stdout.strip()


HANDFUL = 3  # TokenReviews allowed for SCRAPES concurrent scrapes with one token


def token_reviews(kube: AuditedCluster) -> int:
    log = kube.audit_log.read_text().splitlines()
    return sum(1 for line in log if json.loads(line)["objectRef"]["resource"] == "tokenreviews")


@pytest.fixture(scope="module")
def secure(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--lease-name=secure-metrics",), secure=True).start()
    yield svc
    svc.stop()


def test_reader_scrapes_with_tls_verified_against_the_served_certificate(kube: LocalCluster,
                                                                        secure: Service) -> None:
    code, text = secure.get("/metrics", token=token(kube, "reader"))
    assert code == 200 and "nws_nodegroup_nodes" in text, text[:300]
    # The check is real: without the served certificate as CA, the handshake is refused.
    with pytest.raises(urllib.error.URLError) as err:
        urllib.request.urlopen(secure.metrics_url, timeout=10, context=ssl.create_default_context())
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError), err.value


@pytest.mark.parametrize("who,code,reason", [
    ("stranger", 403, "system:serviceaccount:default:stranger may not get /metrics"),
    ("", 401, "no bearer token"),
    ("not-a-token", 401, "invalid bearer token"),
])
def test_others_are_refused_with_a_short_reason(kube: LocalCluster, secure: Service, who: str, code: int,
                                                reason: str) -> None:
    bearer = token(kube, who) if who in ("stranger", "reader") else who
    assert secure.get("/metrics", token=bearer) == (code, reason + "\n")


def test_plain_http_to_the_secure_port_fails(secure: Service) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{secure.port}/metrics", timeout=10)


def test_probes_are_plain_and_apart(secure: Service) -> None:
    assert secure.get("/healthz") == (200, "ok\n")  # no token, plain HTTP, on --probe-port
    assert secure.get("/readyz")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as err:  # /metrics is not served there
        urllib.request.urlopen(f"http://127.0.0.1:{secure.probe_port}/metrics", timeout=10)
    assert err.value.code == 404


def test_scrape_storm_costs_a_handful_of_token_reviews(kube: AuditedCluster, secure: Service) -> None:
    fresh = token(kube, "reader")  # never seen: nothing cached for it

    def scrape(_: int) -> tuple[int, float]:
        started = time.monotonic()
        code = secure.get("/metrics", token=fresh)[0]
        return code, time.monotonic() - started

    before = token_reviews(kube)
    with ThreadPoolExecutor(SCRAPES) as pool:
        storm = list(pool.map(scrape, range(SCRAPES)))
    assert [code for code, _ in storm] == [200] * SCRAPES
    time.sleep(1)  # the audit log is written when a request completes; give it a moment
    reviews = token_reviews(kube) - before
    cached = [scrape(i)[1] for i in range(20)]
    print(f"{SCRAPES} concurrent scrapes: {reviews} TokenReviews; latency under the storm median "
          f"{statistics.median(t for _, t in storm) * 1000:.0f} ms, max {max(t for _, t in storm) * 1000:.0f} ms; "
          f"one at a time, cached: median {statistics.median(cached) * 1000:.1f} ms")
    assert 1 <= reviews <= HANDFUL, reviews


FLOOD_CONNECTIONS = 50  # TLS connections of the flood, each sending requests back to back


FLOOD_ROUND = 2000  # requests per round, each with a token never sent before


READER_SCRAPES = 4  # one a second, during the flood


def apiserver_token_reviews(kube: LocalCluster) -> float:
    """TokenReviews the API server served, from its own apiserver_request_total."""
    text = kube.kubectl("get", "--raw", "/metrics").stdout
    return sum(float(n) for n in re.findall(r'^apiserver_request_total\{[^}]*resource="tokenreviews"[^}]*\} (\S+)$',
                                            text, re.M))


def rss_kib(service: Service) -> int:
    assert service.proc is not None
    status = Path(f"/proc/{service.proc.pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))  # type: ignore[union-attr]


class Flood:
    """Made-up tokens, each new, from FLOOD_CONNECTIONS TLS connections in rounds of FLOOD_ROUND
    requests, in a thread of its own until stopped; ``codes`` counts the answers."""

    def __init__(self, service: Service) -> None:
        self.url, self.ca_file = service.metrics_url, str(service.ca_file)
        self.codes: Counter[int] = Counter()
        self.retry_after: set[str] = set()
        self.stop = threading.Event()
        self.seconds = 0.0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="flood")

    async def _run(self) -> None:
        prefix = uuid.uuid4().hex
        connector = aiohttp.TCPConnector(limit=FLOOD_CONNECTIONS, ssl=ssl.create_default_context(cafile=self.ca_file))
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(n: int) -> None:
                async with session.get(self.url, headers={"Authorization": f"Bearer made-up-{prefix}-{n}"}) as resp:
                    await resp.read()
                    self.codes[resp.status] += 1
                    if resp.status == 429:
                        self.retry_after.add(resp.headers.get("Retry-After", ""))

            started, sent = time.monotonic(), 0
            while not self.stop.is_set():
                await asyncio.gather(*(one(sent + i) for i in range(FLOOD_ROUND)))
                sent += FLOOD_ROUND
            self.seconds = time.monotonic() - started

    def __enter__(self) -> Flood:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(60)


class Reader:
    """Scrapes as Prometheus does: one HTTPS connection kept open, a bearer token."""

    def __init__(self, service: Service, token: str) -> None:
        self.token = token
        self.conn = http.client.HTTPSConnection("127.0.0.1", service.port, context=service.tls_context(), timeout=10)

    def scrape(self) -> tuple[float, Samples]:
        started = time.monotonic()
        self.conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
        resp = self.conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 200, (resp.status, text)
        return time.monotonic() - started, parse(text)


def test_a_flood_of_made_up_tokens_costs_the_bound_and_the_reader_scrapes_from_cache(
        kube: LocalCluster, secure: Service) -> None:
    reader = Reader(secure, token(kube, "reader"))

    def new_connection() -> float:  # a scraper that opens a connection per scrape also pays a TLS handshake
        started = time.monotonic()
        assert secure.get("/metrics", token=reader.token)[0] == 200
        return time.monotonic() - started

    reader.scrape()  # reviewed once: cached from here on
    calm = [reader.scrape()[0] for _ in range(5)]
    calm_new = [new_connection() for _ in range(5)]
    _, before = reader.scrape()
    reviews_before, rss_before = apiserver_token_reviews(kube), rss_kib(secure)
    during, during_new = [], []
    with Flood(secure) as flood:
        for _ in range(READER_SCRAPES):
            time.sleep(1)
            during.append(reader.scrape()[0])
            during_new.append(new_connection())
    time.sleep(0.5)  # reviews under way when the flood stopped complete
    reviews = apiserver_token_reviews(kube) - reviews_before
    _, after = reader.scrape()
    rss_after = rss_kib(secure)

    def delta(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    def ms(seconds: list[float]) -> list[float]:
        return [round(t * 1000, 1) for t in seconds]

    requests = sum(flood.codes.values())
    cached = {d: value(after, "nws_metrics_auth_cache_entries", decision=d) or 0 for d in ("allowed", "denied")}
    print(f"flood: {requests} requests in {flood.seconds:.1f} s ({requests / flood.seconds:.0f}/s) from "
          f"{FLOOD_CONNECTIONS} connections, answers {dict(flood.codes)}; TokenReviews the API server served "
          f"{reviews:.0f} ({reviews / flood.seconds:.1f}/s; bound {REVIEWS_PER_SECOND:g}/s, burst {REVIEW_BURST}); "
          f"reader (connection kept open) {ms(calm)} ms before, {ms(during)} ms during; a new connection per "
          f"scrape {ms(calm_new)} ms before, {ms(during_new)} ms during; RSS {rss_before / 1024:.0f} -> "
          f"{rss_after / 1024:.0f} MiB; decisions cached {cached}")
    # Made-up tokens are refused, never served: 401 once reviewed, 429 beyond the bound (no review).
    assert requests >= FLOOD_ROUND and set(flood.codes) <= {401, 429} and flood.codes[429] > 0, flood.codes
    assert flood.retry_after == {"1"}, flood.retry_after
    # The API server received no more reviews than the bound allows (the bucket may start full).
    assert reviews <= REVIEW_BURST + REVIEWS_PER_SECOND * (flood.seconds + 1), reviews
    assert delta("nws_metrics_auth_reviews_total", decision="denied") == flood.codes[401]
    assert delta("nws_metrics_auth_reviews_refused_total") == flood.codes[429]
    # The reader was never reviewed again: each of its scrapes was a cache hit ...
    assert delta("nws_metrics_auth_reviews_total", decision="allowed") == 0
    assert delta("nws_metrics_auth_cache_hits_total", decision="allowed") == 2 * READER_SCRAPES + 1
    # (How fast it was served, before and during, is printed above: a reading, not a test.)
    # One line in the log says so, not one per refusal.
    said = [line for line in secure.log_text().splitlines() if "answering 429 without a review" in line]
    assert len(said) == 1, said
    # Bounded memory: no more denials cached than reviews sent, no reader pushed out, the process
    # barely grew.
    assert delta("nws_metrics_auth_cache_entries", decision="denied") <= reviews, cached
    assert delta("nws_metrics_auth_cache_entries", decision="allowed") == 0, cached
    assert rss_after - rss_before < 32 * 1024, (rss_before, rss_after)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus (make tools)")
def test_prometheus_scrapes_over_https_with_a_token_file_and_the_alert_fires(
        kube: LocalCluster, secure: Service, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(token(kube, "reader"))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(Thresholds(not_ready_for="3s", down_for="3s"))))
    prom = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{secure.port}"], [rules], scheme="https",
                      ca_file=secure.ca_file, bearer_token_file=token_file).start()
    try:
        wait_for(lambda: prom.query('nws_nodegroup_nodes{group="a"}'), timeout=30)
        [target] = prom.api("/api/v1/targets")["activeTargets"]
        assert target["scrapeUrl"].startswith("https://") and target["health"] == "up", target
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "False")
        wait_for(lambda: [a for a in prom.alerts() if a["labels"]["alertname"] == "NodeGroupNotReady"], timeout=30)
    finally:
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "True")
        prom.stop()


def test_certificate_files_are_served(kube: LocalCluster, tmp_path: Path) -> None:
    cert, key = openssl_cert(tmp_path, "from-file")
    svc = Service(kube, ("--lease-name=secure-files", f"--metrics-cert-file={cert}", f"--metrics-key-file={key}"),
                  secure=True).start()
    try:
        assert svc.ca_file is not None and svc.ca_file.read_text() == cert.read_text()
        assert svc.get("/metrics", token=token(kube, "reader"))[0] == 200
    finally:
        svc.stop()
