"""The token bucket every write of the reconciler takes a token from (``--writes-per-second``), and
the one per object that Events pass (reconciler/events.py): kubeindex's, which the exporter's bound
on token reviews shares."""

from __future__ import annotations

from kubeindex.runtime.ratelimit import TokenBucket

__all__ = ["TokenBucket"]
