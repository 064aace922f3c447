"""The fleet: the member clusters a hub reads capacity from, for the ClusterResourceClaims whose
``clusterName`` is not ``local``.

- **Members are MultiKueue's.** Each MultiKueueCluster (kueue.x-k8s.io, v1beta2 or v1beta1) is a
  member, under its own name. Its ``spec.clusterSource.kubeConfig`` (v1beta2; ``spec.kubeConfig``
  in v1beta1) says where the member's kubeconfig is, as MultiKueue reads it: a Secret (key
  ``kubeconfig``) in Kueue's namespace (``namespace`` here, --fleet-namespace), or a file in this
  container (``locationType: Path``). The Secret is read again every ``RECHECK`` seconds, and the
  member reconnected when it changed (rotated credentials). A member named by v1beta2's
  ``clusterProfileRef`` is not connected: a ClusterProfile's credentials come from an exec plugin
  (Kueue's ``multiKueue.clusterProfile.accessProviders``), and this process runs no plugin that an
  object chooses (as it runs no ``exec`` of a kubeconfig); its claims' Ready (MemberUnsupported)
  and the log say to set ``clusterSource.kubeConfig`` instead.
- **Kueue's version in the member**: its ResourceFlavors are read at the version the member's API
  server prefers among KUEUE_VERSIONS (discovery at each connection); served only at others, or
  not at all, the member is not connected, and the claims' Ready says why.
- **Two watches per member**, in the member: its NodeSummaries (this product, run there with a
  NodeSummarizer over the label its flavors select nodes by) and its ResourceFlavors. A member
  flavor's capacity is read from the member's NodeSummary whose selector equals
  the flavor's ``nodeLabels`` (``allocatable - notReadyAllocatable``: the allocatable of its Ready
  nodes, as for a local claim): a few KB per member, whatever its number of nodes. Added to the
  process's watches (nws_watch_member-<name>-*), never counted against the hub's readiness.
- **Capacity** (``capacity``): None (not known: the claims hold what is in effect) while the
  MultiKueueClusters are not listed yet, while a member's watches have not listed, within
  ``grace`` of its arrival, and for a flavor the member lacks or no NodeSummary covers. A member
  out of contact keeps its last capacity for ``grace`` seconds: a flap changes nothing. Past
  that, or once its MultiKueueCluster is gone, its capacity is zero, and the claims' settle time
  and over-allocation policy decide what the queues lose (``Hold`` keeps the quota).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..client.api import ApiClient, ApiError, ConfigError, connection_from_kubeconfig
from ..model.objects import (
    KUEUE_VERSIONS,
    MemberNodeSummary,
    MultiKueueCluster,
    ResourceFlavor,
)
from ..model.quantity import parse_or_zero
from ..model.resources import MULTIKUEUE_CLUSTERS, NODE_SUMMARIES, RESOURCE_FLAVORS, SECRETS, Resource
from ..runtime import tasks
from ..runtime.backoff import backoff
from ..runtime.clock import REAL, Clock
from ..runtime.logfields import fields
from ..runtime.throttle import ThrottledLog
from .discovery import choose
from .reflector import Handler, Reflector, WatchSettings

log = logging.getLogger(__name__)

MEMBER_GRACE = 300.0  # seconds a member may be out of contact before its capacity counts as gone
RECHECK = 60.0  # seconds between reads of a member's kubeconfig (rotated credentials)
KUBECONFIG_KEY = "kubeconfig"  # the Secret's key, as MultiKueue reads it
MEMBER_CONNECTIONS = 4  # per member: two watches and the odd LIST
Capacity = dict[str, int]
MULTIKUEUE_CLUSTER = MULTIKUEUE_CLUSTERS.group_kind
NOT_LISTED = ("the hub has not listed the MultiKueueClusters yet (is MultiKueue's CRD "
              f"{MULTIKUEUE_CLUSTERS.name} installed, and may the hub list them?)")
MEMBER_RESOURCE = MULTIKUEUE_CLUSTERS.name  # the log lines' resource
AddWatch = Callable[[Reflector], None]
Discover = Callable[[ApiClient], Awaitable[list[Resource]]]
DISCOVERY_ATTEMPTS = 5  # a member's discovery, with backoff, before waiting RECHECK


class SecretReader(Protocol):
    """What the fleet needs of the hub's client: GET a Secret (ApiClient; a scripted one in tests)."""

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = ...,
                  timeout: float = ...) -> bytes: ...


@dataclass(frozen=True)
class MemberProblem:
    """Why a member's capacity is not what its watches say: a claim's Ready reason and message."""

    reason: str  # MemberConnecting | MemberUnreachable | MemberUnsupported
    message: str


class Member:
    """One member cluster: its client, its two watches and what they hold."""

    def __init__(self, name: str, api: ApiClient, settings: WatchSettings, clock: Clock, config: str,
                 flavors: str) -> None:
        self.name = name
        self.api = api
        self.config = config  # the kubeconfig it was made from: reconnect when it changes
        self.clock = clock
        self.added = clock.monotonic()
        self.summaries: dict[str, MemberNodeSummary] = {}
        self.flavors: dict[str, dict[str, str]] = {}  # ResourceFlavor -> nodeLabels
        self.version = 0
        self.reflectors: list[Reflector] = [
            Reflector(api, f"member-{name}-nodesummaries", NODE_SUMMARIES.path(), MemberNodeSummary,
                      Handler(self._summary, self._summary_gone), settings=settings, clock=clock),
            Reflector(api, f"member-{name}-resourceflavors", flavors, ResourceFlavor,
                      Handler(self._flavor, self._flavor_gone), settings=settings, clock=clock),
        ]

    def _summary(self, obj: MemberNodeSummary) -> None:
        self.summaries[obj.metadata.name] = obj
        self.version += 1

    def _summary_gone(self, key: str) -> None:
        self.summaries.pop(key, None)
        self.version += 1

    def _flavor(self, obj: ResourceFlavor) -> None:
        self.flavors[obj.metadata.name] = dict(obj.spec.nodeLabels)
        self.version += 1

    def _flavor_gone(self, key: str) -> None:
        self.flavors.pop(key, None)
        self.version += 1

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def out_of_contact(self) -> float:
        """Seconds since the member last answered (since it was added, if it never did); 0 in contact."""
        now = self.clock.monotonic()
        if not self.synced:
            return now - self.added
        lost = [now - r.contact.lost_at for r in self.reflectors if not r.contact.connected]
        return max(lost, default=0.0)

    def flavor_capacity(self, flavor: str) -> Capacity | None:
        """The allocatable of the Ready nodes, of the NodeSummary that selects exactly the flavor's nodes."""
        labels = self.flavors.get(flavor)
        if not labels:
            return None  # no such flavor, or one of every node (no NodeSummary is all of them)
        for name in sorted(self.summaries):
            summary = self.summaries[name]
            if summary.spec.selector.matchLabels == labels:
                status = summary.status
                return {r: parse_or_zero(v) - parse_or_zero(status.notReadyAllocatable.get(r, 0))
                        for r, v in status.allocatable.items()}
        return None

    def why_unknown(self, flavor: str) -> str:
        labels = self.flavors.get(flavor)
        if labels is None:
            return f"member {self.name} has no ResourceFlavor {flavor}"
        if not labels:
            return (f"ResourceFlavor {flavor} of member {self.name} has no nodeLabels; a hub reads capacity from a "
                    "NodeSummary, which selects nodes by one label")
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return (f"member {self.name} has no NodeSummary of the nodes {selector} (flavor {flavor}'s nodeLabels): run "
                "node-workload-summary there with a NodeSummarizer over that label")


class Unsupported(ConfigError):
    """A member this code cannot read, whatever it retries: the claims' Ready says MemberUnsupported."""


async def served_flavors(api: ApiClient) -> list[Resource]:
    return await api.served_resources(*RESOURCE_FLAVORS.group_kind)


class Fleet:
    """The hub's members, kept equal to the MultiKueueClusters (``upsert`` / ``delete``: the
    handler of their watch), and the capacity the claim controller reads."""

    def __init__(self, api: SecretReader, add_watch: AddWatch, remove_watch: Callable[[str], None],
                 namespace: str = "kueue-system", grace: float = MEMBER_GRACE,
                 settings: WatchSettings | None = None, listed: Callable[[], bool] = lambda: True,
                 clock: Clock = REAL, discover: Discover = served_flavors) -> None:
        self.api = api  # the hub's: reads the Secrets
        self.listed = listed  # the MultiKueueClusters were listed: one absent is no member
        self.namespace = namespace
        self.grace = grace
        self.settings = settings or WatchSettings()
        self.clock = clock
        self._add_watch, self._remove_watch = add_watch, remove_watch
        self.specs: dict[str, MultiKueueCluster] = {}  # member -> its MultiKueueCluster
        self.since: dict[str, float] = {}  # member -> when its MultiKueueCluster was first seen
        self.members: dict[str, Member] = {}  # connected (its watches running)
        self.errors: dict[str, str] = {}  # member -> why it is not connected (its kubeconfig, its Kueue)
        self.unsupported: set[str] = set()  # members whose error no retry mends (Unsupported)
        self.discover = discover  # a member's ResourceFlavor resources, the preferred first
        self._tasks: dict[str, asyncio.Task] = {}
        self._say = ThrottledLog(log, clock=clock.monotonic)
        self._changes = 0

    # -- the MultiKueueClusters ---------------------------------------------------------------

    def upsert(self, obj: MultiKueueCluster) -> None:
        name = obj.metadata.name
        old = self.specs.get(name)
        self.specs[name] = obj
        self.since.setdefault(name, self.clock.monotonic())
        self._changes += 1
        if old is None or old.spec != obj.spec:
            self._restart(name)

    def delete(self, name: str) -> None:
        self.specs.pop(name, None)
        self.since.pop(name, None)
        self._changes += 1
        self._restart(name)

    def _restart(self, name: str) -> None:
        """Stop the member's connection (its watches leave at once) and, while it is a member,
        start a fresh one."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()  # it closes its client
        member = self.members.get(name)
        if member is not None:
            self._detach(member)
        self.errors.pop(name, None)
        self.unsupported.discard(name)
        if name in self.specs:
            self._tasks[name] = asyncio.get_running_loop().create_task(self._keep_connected(name))

    async def stop(self) -> None:
        running, self._tasks = list(self._tasks.values()), {}
        await tasks.stop(running)

    # -- connecting ---------------------------------------------------------------------------

    async def _keep_connected(self, name: str) -> None:
        """Read the member's kubeconfig now and every RECHECK seconds; (re)connect when it
        changed, or when the member stopped serving the version its flavors were read at. The
        member (its client, its watches) is this task's: closed when it ends."""
        member: Member | None = None
        try:
            while True:
                try:
                    config = await self._read_kubeconfig(self.specs[name])
                    if member is None or member.config != config or member.reflectors[1].contact.not_served:
                        if member is not None:
                            await self._close(member)
                            member = None
                        member = await self._connect(name, config)
                    if self.errors.pop(name, None) is not None:
                        self._changes += 1
                    self.unsupported.discard(name)
                    self._say.clear(name)
                except (ConfigError, ApiError, OSError) as err:
                    if self.errors.get(name) != str(err):
                        self._changes += 1
                    self.errors[name] = str(err)
                    if isinstance(err, Unsupported):
                        self.unsupported.add(name)
                    self._say(name, str(err), logging.WARNING, "member %s: %s; retrying every %.0fs", name, err,
                              RECHECK, extra=fields(MEMBER_RESOURCE, name=name, error=str(err)))
                await self.clock.sleep(RECHECK)
        finally:
            if member is not None:
                await self._close(member)

    async def _read_kubeconfig(self, obj: MultiKueueCluster) -> str:
        where = obj.spec.kubeconfig()
        if where is None:
            profile = obj.spec.profile()
            raise Unsupported(
                f"MultiKueueCluster {obj.metadata.name} names its cluster by clusterProfileRef (ClusterProfile "
                f"{profile or '?'}), whose credentials come from an exec plugin, which this service does not run; "
                "set spec.clusterSource.kubeConfig instead (locationType Secret: a Secret in "
                f"{self.namespace} with key {KUBECONFIG_KEY!r}; or Path)")
        if where.locationType == "Path":
            try:
                return Path(where.location).read_text()
            except OSError as err:
                raise ConfigError(f"kubeconfig file {where.location}: {err.strerror}") from None
        path = SECRETS.path(self.namespace, where.location)
        try:
            secret = await self.api.get(path)
        except ApiError as err:
            raise ConfigError(f"Secret {self.namespace}/{where.location}: {err}") from None
        data = json.loads(secret).get("data") or {}
        if KUBECONFIG_KEY not in data:
            raise ConfigError(f"Secret {self.namespace}/{where.location} has no key {KUBECONFIG_KEY!r}")
        return base64.b64decode(data[KUBECONFIG_KEY]).decode()

    async def _connect(self, name: str, config: str) -> Member:
        where = f"the kubeconfig of member {name}"
        api = ApiClient(connection_from_kubeconfig(config, where), MEMBER_CONNECTIONS)
        try:
            flavors = await self._discover(api, name)
        except BaseException:
            await api.close()
            raise
        member = Member(name, api, self.settings, self.clock, config, flavors)
        self.members[name] = member
        for reflector in member.reflectors:
            self._add_watch(reflector)
        log.info("member %s: watching its NodeSummaries and ResourceFlavors (%s) at %s", name, flavors,
                 member.api.connection.host, extra=fields(MEMBER_RESOURCE, name=name))
        self._changes += 1
        return member

    async def _discover(self, api: ApiClient, name: str) -> str:
        """The path of the member's ResourceFlavors, at the version it prefers among KUEUE_VERSIONS."""
        served: list[Resource] = []
        for attempt in range(DISCOVERY_ATTEMPTS):
            try:
                served = await self.discover(api)
                break
            except ApiError:
                if attempt == DISCOVERY_ATTEMPTS - 1:
                    raise
                await self.clock.sleep(backoff(attempt))
        resource = choose(served, KUEUE_VERSIONS)
        if resource is not None:
            return resource.path()
        if served:
            raise Unsupported(f"member {name} serves ResourceFlavors only at "
                              f"{', '.join(r.api_version for r in served)}, which this version of node-workload-summary"
                              f" does not read (it reads {', '.join(KUEUE_VERSIONS)})")
        raise ConfigError(f"member {name} serves no ResourceFlavors ({RESOURCE_FLAVORS.name}): is Kueue "
                          "installed there?")

    def _detach(self, member: Member) -> None:
        """The member's watches stop and its capacity is no longer read (its client stays open)."""
        if self.members.get(member.name) is member:
            del self.members[member.name]
            for reflector in member.reflectors:
                self._remove_watch(reflector.name)
            self._changes += 1

    async def _close(self, member: Member) -> None:
        self._detach(member)
        await member.api.close()

    # -- what the claims read -----------------------------------------------------------------

    @property
    def version(self) -> int:
        """Grows with every change a claim may read (O(members)): a reader tells whether to look again."""
        return self._changes + int(self.listed()) + sum(m.version for m in self.members.values())

    def problem(self, name: str) -> MemberProblem | None:
        """Why the member's capacity is not read from its watches now (None: it is)."""
        if name not in self.specs:
            if not self.listed():
                return MemberProblem("MemberConnecting", NOT_LISTED)
            return MemberProblem("MemberUnreachable", f"no MultiKueueCluster {name}: not (or no longer) a member")
        if name in self.unsupported:
            return MemberProblem("MemberUnsupported", f"member {name}: {self.errors[name]}")
        member = self.members.get(name)
        synced = member is not None and member.synced
        away = member.out_of_contact() if member is not None else self.clock.monotonic() - self.since[name]
        if synced and not away:
            return None
        if synced:
            why = f"out of contact (last error: {_last_error(member)})"  # no duration: a status written once
        else:
            last = _last_error(member) if member is not None else "connecting"
            why = self.errors.get(name) or f"initial sync in progress ({last})"
        if away >= self.grace:
            return MemberProblem("MemberUnreachable", f"member {name}: {why}; past the {self.grace:.0f}s grace, "
                                                      "its capacity counts as gone")
        if synced:
            return None  # out of contact within the grace: its last capacity stands
        return MemberProblem("MemberConnecting", f"member {name}: {why}")

    def capacity(self, name: str, flavor: str) -> Capacity | None:
        """The member flavor's capacity: None when not known (hold), {} when gone (see the module)."""
        problem = self.problem(name)
        if problem is not None:
            return {} if problem.reason == "MemberUnreachable" else None
        return self.members[name].flavor_capacity(flavor)

    def why_unknown(self, name: str, flavor: str) -> str:
        member = self.members.get(name)
        return member.why_unknown(flavor) if member is not None else f"member {name} is not connected"

    def wanted_claims(self) -> list[tuple[str, str]]:
        """(member, flavor) of every member flavor whose capacity is known: each gets a claim."""
        return sorted((name, flavor) for name, member in self.members.items() if self.problem(name) is None
                      for flavor in member.flavors if member.flavor_capacity(flavor) is not None)


def _last_error(member: Member | None) -> str:
    errors = [r.contact.last_error for r in member.reflectors if r.contact.last_error] if member is not None else []
    return errors[0] if errors else "none"
