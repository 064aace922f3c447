"""A histogram's counts, kept in plain Python for the collectors to read at scrape time: an
observation costs one bisection over the bucket bounds (a dozen), no lock and no allocation."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

# client-go's rest_client_request_duration_seconds buckets: a LIST page or a write (ms) to a slow
# LIST of a large collection (a minute).
REQUEST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# A work queue's waits and writes: an idle worker takes a key within a millisecond; a write waits
# for the token bucket and the API server (ms), a backlog for up to minutes.
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Counts per bucket (``le`` bounds, +Inf implied), their sum and count; never reset."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: a value equal to a bound counts in it
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) per bucket, +Inf last: prometheus_client's form."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((floatToGoString(bound), total))
        return out
