"""What both halves of test_crds (tests/unit and tests/cluster) use."""

from __future__ import annotations

KINDS = ("clusterresourceclaims", "nodesummarizers", "nodesummaries", "workloadsummarizers", "workloadsummaries")
