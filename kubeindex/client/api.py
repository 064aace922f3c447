"""A small asyncio client for the Kubernetes API: raw bytes in and out, nothing decoded here.

Authentication comes from the official client's kubeconfig / in-cluster loaders (exec plugins,
token files and their refresh included). Reads (``get``: discovery; ``get_frames``: LIST pages,
taken as they come) go through one aiohttp session, which asks for gzip; other requests
(``request``: writes, leases) on kept-alive connections of our own (exchange.py), and watches on
a connection each (watchstream.py).

Every request is measured (``RequestMetrics``, client-go's ``rest_client_*``): its duration per
verb and resource, and its answer per status code and HTTP method. The resource is read from the
path (``path_parts``): the plural, with its group, never an object's name. A watch's duration ends
when the server answered (its stream may last minutes).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Self

import aiohttp
import msgspec
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from ..model.resources import Resource
from ..runtime.histogram import REQUEST_BUCKETS, Histogram
from ..runtime.logfields import Extra, Told, fields
from . import exchange, protobuf, watchstream

log = logging.getLogger(__name__)

JSON = "application/json"
# Metadata-only responses (owner kinds): the server strips everything but metadata.
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;q=0.9"
PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;q=0.9"


USER_AGENT = "node-workload-summary"  # in the API server's audit log and its per-client metrics
SILENCE_EVERY = 10.0  # seconds: the watches are told of a silent connection at most this often
# Objects per LIST page, unless set. A server that serves pages from its watch cache walks the
# cache from the page's start for each (docs/benchmarks.md, "Pages of 20,000"): few large pages,
# which cost this side no memory (protobuf.ListItems). From etcd, client-go's size.
PAGE_FROM_CACHE = 20000
PAGE_FROM_ETCD = 500


class ApiError(Told):
    """A request that failed: an answer other than 2xx, or none at all (``status`` 0: the
    connection failed, broke or stayed silent past its timeout). The subclasses say what a
    caller may do about it; other statuses (400, 422, ...) are plain ApiErrors."""

    def __init__(self, status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details or {}  # the Status's details (causes, the object's name and kind)

    @property
    def causes(self) -> set[str]:
        """The reasons (StatusCause.Type) of the Status's causes."""
        return {str(c.get("reason", "")) for c in self.details.get("causes") or [] if isinstance(c, dict)}


class Forbidden(ApiError):
    """401 or 403: the credentials or RBAC do not allow it (until someone changes them)."""


class NotFound(ApiError):
    """404: no such object, or the resource is not served (a CRD not installed)."""


class Conflict(ApiError):
    """409: already exists, or a precondition (resourceVersion, UID) failed."""


class Gone(ApiError):
    """410: the resourceVersion (or continue token) is too old, compacted away."""


class Transient(ApiError):
    """429, 5xx, or no answer: worth retrying as it is, after a backoff."""


_BY_STATUS: dict[int, type[ApiError]] = {401: Forbidden, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
                                         429: Transient, 500: Transient, 502: Transient, 503: Transient,
                                         504: Transient}


def status_error(status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> ApiError:
    """The error of a Status with this code (an HTTP answer, or a watch's ERROR event)."""
    return _BY_STATUS.get(status, ApiError)(status, reason, message, details)


def error_from_body(status: int, body: bytes, limit: int = 300) -> ApiError:
    """The typed error of a non-2xx answer: a Status's reason, message and details (details from
    JSON only: a protobuf Status, to a protobuf GET, gives its reason and message), or what a
    person can read of any other body (its first ``limit`` characters)."""
    if body.startswith(protobuf.MAGIC):
        try:
            answer = protobuf.status(protobuf.unwrap(body))
            return status_error(status, answer.reason, answer.message[:limit])
        except protobuf.ProtobufError:
            pass  # what a person can read of it, below
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        parsed = {}
    message = str(parsed["message"])[:limit] if parsed.get("message") else \
        body[:limit].decode(errors="replace").strip()
    details = parsed.get("details")
    reason = str(parsed.get("reason") or "")
    return status_error(status, reason, message, details if isinstance(details, dict) else None)


def transport_error(err: BaseException) -> Transient:
    """No answer: a connection refused, reset or broken mid-stream, or silent past its timeout."""
    if isinstance(err, watchstream.StreamError):
        return Transient(0, err.reason, err.message)
    if isinstance(err, watchstream.Unanswered):
        return Transient(0, "unanswered", str(err))
    if isinstance(err, TimeoutError):
        return Transient(0, "timeout", "no data within the read timeout (connection presumed dead)")
    return Transient(0, type(err).__name__, " ".join(str(err).split()) or type(err).__name__)


# What a request raises when no (complete) answer came: become Transient here.
_TRANSPORT = (aiohttp.ClientError, watchstream.StreamError, TimeoutError, OSError)


@dataclass
class Connection:
    host: str
    ssl_context: ssl.SSLContext | bool
    _config: k8s_client.Configuration

    def headers(self) -> dict[str, str]:
        # get_api_key_with_prefix runs the refresh hook: rotated in-cluster tokens are picked up.
        token = (self._config.get_api_key_with_prefix("BearerToken", alias="authorization") or "").strip()
        if not token:
            return {}
        # The in-cluster loader stores "bearer <token>" (lower case), kubeconfig "Bearer <token>"
        # or the bare token: the scheme is case-insensitive, and must not be sent twice.
        scheme, _, credentials = token.partition(" ")
        return {"Authorization": f"Bearer {credentials.strip() if scheme.lower() == 'bearer' else token}"}


class ConfigError(Exception):
    """No usable API server configuration; the message names the source and path that failed."""


IN_CLUSTER = "in-cluster service account"
HOME_KUBECONFIG = "~/.kube/config"


def _config_source(kubeconfig: str | None) -> tuple[str, str]:
    """(source, path) of the configuration to load, in client-go's order: --kubeconfig, $KUBECONFIG,
    the in-cluster service account, ~/.kube/config."""
    if kubeconfig is not None:
        if not os.path.exists(os.path.expanduser(kubeconfig)):
            raise ConfigError(f"--kubeconfig {kubeconfig}: no such file")
        return "--kubeconfig", kubeconfig
    env = os.environ.get("KUBECONFIG")
    if env:  # a list like the PATH; client-go skips the missing entries
        if not any(os.path.exists(os.path.expanduser(p)) for p in env.split(os.pathsep) if p):
            raise ConfigError(f"$KUBECONFIG {env}: no such file")
        return "$KUBECONFIG", env
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        return IN_CLUSTER, ""
    home = os.path.expanduser(HOME_KUBECONFIG)
    if os.path.exists(home):
        return HOME_KUBECONFIG, home
    raise ConfigError("no Kubernetes API configuration: tried --kubeconfig (not set), $KUBECONFIG (not set), "
                      f"{IN_CLUSTER} ($KUBERNETES_SERVICE_HOST not set), {home} (no such file)")


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """From --kubeconfig, $KUBECONFIG, the in-cluster service account or ~/.kube/config, the first
    one set; ConfigError (one line) names what was tried and why it failed."""
    config = k8s_client.Configuration()
    source, path = _config_source(kubeconfig)
    where = path if source == HOME_KUBECONFIG else f"{source} {path}".strip()
    if source == IN_CLUSTER:
        return _connection(where, lambda: k8s_config.load_incluster_config(client_configuration=config), config)
    return _connection(where, lambda: k8s_config.load_kube_config(
        config_file=path, context=context, client_configuration=config, persist_config=False), config)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl works in when none is named, from the same configuration as
    ``load_connection``: the context's, the pod's own in a cluster, else ``default``."""
    source, path = _config_source(kubeconfig)
    if source == IN_CLUSTER:
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as file:
                return file.read().strip() or "default"
        except OSError:
            return "default"
    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=path)
    except Exception as err:  # as load_connection: the configuration's failure, where it came from
        raise ConfigError(f"{path}: {' '.join(str(err).split())}") from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def connection_from_kubeconfig(text: str, where: str) -> Connection:
    """From a kubeconfig's content (a member cluster's, read from a Secret): its current context,
    certificates and keys inline (``*-data``) and loaded from memory, never written to the (in a
    pod, read-only) disk. ConfigError names ``where`` it came from."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not YAML: {' '.join(str(err).split())}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: not a kubeconfig (a YAML mapping with clusters, users and contexts)")
    refused = _not_self_contained(document)
    if refused:
        raise ConfigError(f"{where}: {', '.join(refused)} not allowed: a kubeconfig from a Secret must carry its "
                          "credentials inline (token, client-certificate-data, certificate-authority-data)")
    try:
        context = _named(document, "contexts", document.get("current-context"))["context"]
        cluster = _named(document, "clusters", context["cluster"])["cluster"]
        user = _named(document, "users", context["user"])["user"] if context.get("user") else {}
        server = str(cluster["server"]).rstrip("/")
        tls = ssl.create_default_context(cadata=_pem(cluster, "certificate-authority-data") or None)
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        if user.get("client-certificate-data"):
            load_pem(tls, (_pem(user, "client-certificate-data") + "\n" + _pem(user, "client-key-data")).encode())
    except (KeyError, TypeError, ValueError, ssl.SSLError) as err:
        raise ConfigError(f"{where}: {type(err).__name__}: {err}") from None
    config = k8s_client.Configuration()
    config.host = server
    if user.get("token"):
        config.api_key["authorization"] = f"Bearer {user['token']}"
    return Connection(server, tls, config)


def _named(document: dict[str, Any], section: str, name: Any) -> dict[str, Any]:
    """The entry of a kubeconfig section by name (no name: the first one)."""
    entries = [e for e in document.get(section) or [] if isinstance(e, dict)]
    found = next((e for e in entries if name is None or e.get("name") == name), None)
    if found is None:
        raise KeyError(f"no {section} entry named {name!r}" if name is not None else f"no {section}")
    return found


def _pem(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key)
    return base64.b64decode(value).decode() if value else ""


def load_pem(context: ssl.SSLContext, pem: bytes) -> None:
    """A certificate chain and its key into ``context``. The ssl module loads only from paths: an
    anonymous memory file where there is one (Linux), else a private temporary file removed at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tls")
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tls.pem")
        with open(path, "wb") as file:
            file.write(pem)
        context.load_cert_chain(path)


# What a kubeconfig from a Secret may not hold: a command to run or a file to read in this process
# (whoever may write the Secret would choose them), as newer Kueue refuses for MultiKueue.
NOT_INLINE = {"clusters": ("cluster", ("certificate-authority",)),
              "users": ("user", ("exec", "auth-provider", "tokenFile", "client-certificate", "client-key"))}


def _not_self_contained(document: dict[str, Any]) -> list[str]:
    refused = []
    for section, (inner, keys) in NOT_INLINE.items():
        for i, entry in enumerate(document.get(section) or []):
            fields = entry.get(inner) if isinstance(entry, dict) else None
            refused += [f"{section}[{i}].{inner}.{key}" for key in keys if isinstance(fields, dict) and key in fields]
    return refused


def _connection(where: str, load: Callable[[], None], config: k8s_client.Configuration) -> Connection:
    try:
        load()
        ssl_context: ssl.SSLContext | bool = False
        if config.verify_ssl:
            ssl_context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
            if config.cert_file:
                ssl_context.load_cert_chain(config.cert_file, config.key_file)
    except Exception as err:  # any failure here is the configuration's: say where it came from
        raise ConfigError(f"{where}: {' '.join(str(err).split())}") from None
    return Connection(config.host.rstrip("/"), ssl_context, config)


def predates_watch_list(version: dict[str, Any]) -> str:
    """Why a server of this /version cannot stream lists, or "". Servers before 1.27 ignore
    sendInitialEvents and never send the bookmark that ends the initial state: a WatchList there
    would wait for ever. (1.27 to 1.33 refuse it while its feature gate is off: see the reflector.)"""
    minor = _number(version, "minor")
    if str(version.get("major")) == "1" and minor < 27:
        return f"the API server is {version.get('gitVersion') or f'1.{minor}'}, older than 1.27"
    return ""


def _number(version: dict[str, Any], part: str) -> int:
    """/version's "major" or "minor" as a number ("34+" of a managed build: 34; absent: 0)."""
    return int("".join(c for c in str(version.get(part, "")) if c.isdigit()) or 0)


def serves_pages_from_cache(version: dict[str, Any]) -> bool:
    """Whether a server of this /version serves every page of a consistent paged LIST from its
    watch cache: 1.34 and later (ListFromCacheSnapshot, on by default). Before, the pages after
    the first come from etcd."""
    major = _number(version, "major")
    return major > 1 or (major == 1 and _number(version, "minor") >= 34)


def path_parts(path: str) -> tuple[str, str, str]:
    """(resource, namespace, name) of an API path. The resource is the plural, with its group as
    kubectl writes it (``pods``, ``leases.coordination.k8s.io``), a subresource left out; ""
    for a path that names no resource (discovery, ``/version``)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts[0] == "api" and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return "", "", ""
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    return (f"{rest[0]}.{group}" if group else rest[0]), namespace, (rest[1] if len(rest) > 1 else "")


def path_fields(path: str, error: BaseException | str | None = None) -> Extra:
    """The log fields (runtime/logfields.py) of the object (or collection) an API path names."""
    resource, namespace, name = path_parts(path)
    return fields(resource, namespace, name, error)


NO_ANSWER = "<error>"  # the code of a request that got no answer (client-go's)


class RequestMetrics:
    """client-go's rest_client_* metrics of every request of the clients that share it, read by a
    collector at scrape time. Bounded: one histogram per (verb, resource) met, one count per
    (code, HTTP method) met."""

    def __init__(self) -> None:
        self.durations: dict[tuple[str, str], Histogram] = {}  # (verb, resource) -> seconds
        self.requests: dict[tuple[str, str], int] = {}  # (code, method) -> requests

    def observe(self, method: str, path: str, params: dict[str, str] | None, code: str, seconds: float) -> None:
        """One request: its verb is the HTTP method, or LIST (a GET of a collection) or WATCH."""
        resource, _, name = path_parts(path)
        if params is not None and params.get("watch") in ("1", "true"):
            verb = "WATCH"
        elif method == "GET" and resource and not name:
            verb = "LIST"
        else:
            verb = method
        histogram = self.durations.get((verb, resource))
        if histogram is None:
            histogram = self.durations[verb, resource] = Histogram(REQUEST_BUCKETS)
        histogram.observe(seconds)
        self.requests[code, method] = self.requests.get((code, method), 0) + 1


class ApiClient:
    def __init__(self, connection: Connection, max_connections: int = 64,
                 metrics: RequestMetrics | None = None) -> None:
        self.connection = connection
        self.metrics = metrics if metrics is not None else RequestMetrics()
        self._session: aiohttp.ClientSession | None = None
        self._limit = max_connections
        self._endpoint = watchstream.Endpoint(connection.host, connection.ssl_context)
        self._pool = exchange.ConnectionPool(self._endpoint, max_connections, on_silent=self._silent)
        # Told when a request's connection went silent (see _silent): the watches reconnect.
        self.on_silence: list[Callable[[], None]] = []
        self._silence_told = -SILENCE_EVERY
        self._discovery: dict[str, dict[str, Resource]] = {}  # apiVersion -> kind -> resource
        # The server's answer to the first streaming list (WatchList) it refused, e.g. with its
        # WatchList feature gate off: remembered for this server, so every reflector lists instead.
        self.watch_list_refused = ""
        self.pages_from_cache = False  # the server serves every page of a LIST from its watch cache (1.34+)
        self._version_checked = False
        self._version_lock = asyncio.Lock()  # the reflectors start together: one GET /version for all

    async def _know_version(self) -> None:
        """Asks GET /version once (the reflectors start together: one request for all)."""
        if self._version_checked:
            return
        async with self._version_lock:
            if self._version_checked:
                return
            version = json.loads(await self.get("/version", timeout=15))
            self._version_checked = True
            self.pages_from_cache = serves_pages_from_cache(version)
            pages = f"it serves every LIST page from its watch cache (auto: pages of {PAGE_FROM_CACHE})" \
                if self.pages_from_cache else "LIST pages after the first come from etcd (auto: a WatchList, " \
                "where it serves one)"
            log.info("the API server is %s: %s", version.get("gitVersion") or "of an unknown version", pages)
            too_old = predates_watch_list(version)
            # A refusal recorded while /version was asked (another reflector's 422) stays.
            if too_old and not self.watch_list_refused:
                self.watch_list_refused = too_old
                log.warning("WatchList not used (%s); using paged LISTs with this server", too_old)

    async def auto_initial_list(self) -> Literal["watchlist", "list"]:
        """How ``--initial-list=auto`` reads the initial state from this server: paged LISTs where
        it serves every page from its watch cache (1.34+: cheaper for it than a WatchList, a
        twenty-third of the bytes, as consistent); else a WatchList, unless the server refused one
        or predates it."""
        if not self.watch_list_refused:
            await self._know_version()
        return "watchlist" if not self.pages_from_cache and not self.watch_list_refused else "list"

    async def page_size(self) -> int:
        """Objects per LIST page when the settings leave it to the server: PAGE_FROM_CACHE where
        it serves pages from its watch cache, PAGE_FROM_ETCD where pages after the first come
        from etcd."""
        await self._know_version()
        return PAGE_FROM_CACHE if self.pages_from_cache else PAGE_FROM_ETCD

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.connection.ssl_context, limit=self._limit)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        return self._session

    async def close(self) -> None:
        self._pool.close()
        if self._session is not None:
            await self._session.close()

    def renew_pool(self) -> aiohttp.ClientSession | None:
        """Requests from now on open new connections; those under way keep theirs. For a view that
        must be fresh: an idle pooled connection may be as dead as a silent watch (a load balancer
        that dropped every flow without a reset) and would hold the next request until its
        timeout. Returns the old session, for the caller to close once done with it."""
        self._pool.renew()
        old, self._session = self._session, None
        return old

    def _silent(self) -> None:
        """A request went out and no answer came within its timeout. A path that drops flows
        without a reset (a load balancer or NAT that lost its state) leaves every connection opened
        before as dead, and a silent watch is otherwise noticed only after its read timeout
        (minutes): the idle connections go; at most every SILENCE_EVERY seconds (an overloaded
        server is not answered with a storm of new requests) the requests under way end too, to be
        sent again on new connections, and the watches are told."""
        now = time.monotonic()
        if now - self._silence_told < SILENCE_EVERY:
            self._pool.renew()
            return
        self._silence_told = now
        self.abandon()
        for listener in self.on_silence:
            listener()

    def abandon(self) -> None:
        """Every connection of this client is presumed dead (another client's went silent): the
        idle ones go, the requests under way end at once, unanswered."""
        self._pool.abandon()

    def _headers(self, accept: str) -> dict[str, str]:
        return {"Accept": accept, "User-Agent": USER_AGENT, **self.connection.headers()}

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = JSON,
                  timeout: float = 60) -> bytes:
        """A read, which may be large (a LIST): the body of a 2xx answer, else as ``request``."""
        headers = self._headers(accept)
        return await self._measured("GET", path, params, self._aiohttp("GET", path, params, headers, timeout))

    async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                         framing: Callable[[str], watchstream.Framing], on_frame: Callable[[bytes], None],
                         timeout: float = 60) -> None:
        """A read taken as it comes (a LIST page): its body cut into frames by ``framing(the
        answer's Content-Type)`` and handed to ``on_frame``, so that it is never held whole. What
        ``on_frame`` or the framing raises ends the read, raised here. Errors as ``request``."""
        headers = self._headers(accept)
        await self._measured("GET", path, params, self._aiohttp_frames(path, params, headers, timeout, framing,
                                                                       on_frame))

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = JSON, timeout: float = 30) -> bytes:
        """Any request with a small answer: the body of a 2xx answer, else the typed ApiError
        (Transient when no answer came: no transport's exceptions leave this client)."""
        data = body if isinstance(body, bytes) else (msgspec.json.encode(body) if body is not None else None)
        headers = self._headers(JSON)
        if data is not None:
            headers["Content-Type"] = content_type
        return await self._measured(method, path, params,
                                    self._pool.request(method, path, params, headers, data, timeout))

    async def _aiohttp(self, method: str, path: str, params: dict[str, str] | None, headers: dict[str, str],
                       timeout: float) -> exchange.Answer:
        async with self.session.request(method, self.connection.host + path, params=params, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return exchange.Answer(resp.status, await resp.read())

    async def _aiohttp_frames(self, path: str, params: dict[str, str] | None, headers: dict[str, str],
                              timeout: float, framing: Callable[[str], watchstream.Framing],
                              on_frame: Callable[[bytes], None]) -> exchange.Answer:
        async with self.session.get(self.connection.host + path, params=params, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status >= 300:
                return exchange.Answer(resp.status, await resp.read())
            cut = framing(resp.headers.get("Content-Type", ""))
            async for data in resp.content.iter_any():  # as it came (gzip undone)
                for frame in cut.feed(data):
                    on_frame(frame)
                await asyncio.sleep(0)  # what came is handled: let the other loops run
            for frame in cut.end():
                on_frame(frame)
            return exchange.Answer(resp.status, b"")

    async def _measured(self, method: str, path: str, params: dict[str, str] | None,
                        answering: Awaitable[exchange.Answer]) -> bytes:
        """The answer's body, the request counted and timed."""
        started = time.monotonic()
        try:
            answer = await answering
        except _TRANSPORT as err:
            self.metrics.observe(method, path, params, NO_ANSWER, time.monotonic() - started)
            raise transport_error(err) from err
        self.metrics.observe(method, path, params, str(answer.status), time.monotonic() - started)
        if answer.status >= 300:
            raise error_from_body(answer.status, answer.body)
        return answer.body

    async def watch(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                    on_frame: Callable[[bytes], None], connect_timeout: float = 15,
                    on_open: Callable[[str], None] | None = None,
                    gather: Callable[[], float] | None = None) -> None:
        """A watch: ``on_frame`` gets its events' bytes one by one, in the framing of the
        encoding the server answered in (``on_open`` gets its Content-Type once it answered
        200), until the server ends it; what ``on_frame`` raises ends it too, raised here. An idle
        watch may send nothing for a minute: ``read_timeout`` bounds the silence between reads,
        so a connection that died without closing is noticed. ``gather``: seconds to gather
        events between reads under churn (``watchstream.Stream.deliver``). Errors as ``request``.
        Read on a connection of its own, off aiohttp: kubeindex/client/watchstream.py says why."""
        started, stream = time.monotonic(), None
        try:
            stream = await watchstream.open_stream(self._endpoint, path, params, self._headers(accept),
                                                   connect_timeout, read_timeout)
            status = stream.head.status
            self.metrics.observe("GET", path, params, str(status), time.monotonic() - started)
            if status >= 300:
                raise error_from_body(status, await stream.read_all())
            content_type = stream.head.headers.get("content-type", "")
            if on_open is not None:
                on_open(content_type)
            framing = watchstream.LengthPrefixed() if content_type.startswith(protobuf.MEDIA_TYPE) \
                else watchstream.JsonLines()
            await stream.deliver(framing, on_frame, gather)
        except watchstream.Raised as raised:  # the consumer's own error, whatever its type: as it was
            raise raised.error from None
        except _TRANSPORT as err:
            if stream is None:
                self.metrics.observe("GET", path, params, NO_ANSWER, time.monotonic() - started)
            raise transport_error(err) from err
        finally:
            if stream is not None:
                stream.close()

    # -- discovery ---------------------------------------------------------------------------

    async def _group_version(self, api_version: str, refresh: bool = False) -> dict[str, Resource]:
        if api_version in self._discovery and not refresh:
            return self._discovery[api_version]
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            body = json.loads(await self.get(path, timeout=15))
        except NotFound:
            body = {"resources": []}
        group, _, version = api_version.rpartition("/")
        kinds = {
            r["kind"]: Resource(group, version, r["kind"], r["name"], r["namespaced"])
            for r in body.get("resources", [])
            if "/" not in r["name"] and {"list", "watch"} <= set(r.get("verbs", []))
        }
        self._discovery[api_version] = kinds
        return kinds

    async def resource_for(self, api_version: str, kind: str) -> Resource | None:
        """The listable/watchable resource of ``kind`` in ``api_version`` (None: not served)."""
        kinds = await self._group_version(api_version)
        if kind not in kinds:
            kinds = await self._group_version(api_version, refresh=True)
        return kinds.get(kind)

    async def preferred_resource(self, group: str, kind: str, version: str | None = None) -> Resource | None:
        """The resource of group/kind at ``version``, or at the group's preferred version."""
        if version:
            return await self.resource_for(f"{group}/{version}" if group else version, kind)
        if not group:
            return await self.resource_for("v1", kind)
        for api_version in await self._group_versions(group):
            resource = await self.resource_for(api_version, kind)
            if resource is not None:
                return resource
        return None

    async def served_resources(self, group: str, kind: str) -> list[Resource]:
        """The kind's resource at every version of the group that serves it, the preferred first."""
        out = []
        for api_version in await self._group_versions(group):
            resource = await self.resource_for(api_version, kind)
            if resource is not None:
                out.append(resource)
        return out

    async def _group_versions(self, group: str) -> list[str]:
        """The group's versions ("group/version"), in the API server's order of preference."""
        try:
            body = json.loads(await self.get(f"/apis/{group}", timeout=15))
        except NotFound:
            return []
        versions = [body.get("preferredVersion", {}).get("groupVersion")]
        versions += [v["groupVersion"] for v in body.get("versions", [])]
        return list(dict.fromkeys(v for v in versions if v))

