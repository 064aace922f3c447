"""Each resource the service reads or writes, declared once as a value: its group, version, kind,
plural and scope. Paths, queue keys, log fields and the RBAC tests are made from these, so a
plural is spelled in one place (client-go's schema.GroupVersionResource with its RESTMapping).

Kinds whose version is the API server's to choose (Kueue's, an owner kind) are found by discovery
(kubeindex/watch/discovery.py), which answers with a ``Resource`` too; ``at(version)`` is the same
resource at another version."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .objects import GROUP, KARPENTER_GROUP, KUEUE_GROUP, SCHEDULING_GROUP, VERSION


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """As kubectl and the log lines write it, e.g. "replicasets.apps"; "pods" in the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> tuple[str, str]:
        return self.group, self.kind

    def path(self, namespace: str = "", name: str = "", subresource: str = "") -> str:
        """The collection (across all namespaces without ``namespace``), or one object and its
        subresource: ``/apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]``."""
        path = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        if name:
            path += f"/{name}" + (f"/{subresource}" if subresource else "")
        return path

    def at(self, version: str) -> Resource:
        return replace(self, version=version)


# The core kinds every instance watches.
NODES = Resource("", "v1", "Node", "nodes", False)
PODS = Resource("", "v1", "Pod", "pods", True)
SECRETS = Resource("", "v1", "Secret", "secrets", True)  # a fleet member's kubeconfig

# This project's API (crds/).
NODE_SUMMARIZERS = Resource(GROUP, VERSION, "NodeSummarizer", "nodesummarizers", False)
WORKLOAD_SUMMARIZERS = Resource(GROUP, VERSION, "WorkloadSummarizer", "workloadsummarizers", False)
NODE_SUMMARIES = Resource(GROUP, VERSION, "NodeSummary", "nodesummaries", False)
WORKLOAD_SUMMARIES = Resource(GROUP, VERSION, "WorkloadSummary", "workloadsummaries", True)
CLAIMS = Resource(GROUP, VERSION, "ClusterResourceClaim", "clusterresourceclaims", False)
SUMMARIZERS = (NODE_SUMMARIZERS, WORKLOAD_SUMMARIZERS)
SUMMARIES = (NODE_SUMMARIES, WORKLOAD_SUMMARIES)
OURS = (*SUMMARIZERS, *SUMMARIES, CLAIMS)  # all at API_VERSION

# What the service writes besides its own objects.
LEASES = Resource("coordination.k8s.io", "v1", "Lease", "leases", True)
EVENTS = Resource("events.k8s.io", "v1", "Event", "events", True)
TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", False)
ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False)

# Kueue's kinds, at the newest version the service reads; discovery picks the served one (at()).
RESOURCE_FLAVORS = Resource(KUEUE_GROUP, "v1beta2", "ResourceFlavor", "resourceflavors", False)
CLUSTER_QUEUES = Resource(KUEUE_GROUP, "v1beta2", "ClusterQueue", "clusterqueues", False)
MULTIKUEUE_CLUSTERS = Resource(KUEUE_GROUP, "v1beta2", "MultiKueueCluster", "multikueueclusters", False)

# The in-tree Workload API (Kubernetes 1.37+, when served): PodGroups in full, Workloads as owners.
POD_GROUPS = Resource(SCHEDULING_GROUP, "v1beta1", "PodGroup", "podgroups", True)
SCHEDULING_WORKLOADS = Resource(SCHEDULING_GROUP, "v1beta1", "Workload", "workloads", True)

# Karpenter's NodeClaims, read whenever served: a pool's rollout, the candidates for disruption.
NODECLAIMS = Resource(KARPENTER_GROUP, "v1", "NodeClaim", "nodeclaims", False)

BY_PLURAL = {r.plural: r for r in (NODES, PODS, *OURS)}  # a queue key's plural -> its resource
