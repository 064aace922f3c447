"""A reflector's contact with the API server, for readiness: whether its requests are answered,
since when they are not, and how the last one failed.

A LIST page or a WATCH answered with 200 is contact (``made``); an error or a read timeout
(``lost``) marks the reflector disconnected since that moment, until the next contact. An idle
healthy watch stays connected however long no event comes.

A failure is logged when its reason first appears and then at most every ``LOG_EVERY`` seconds
while it persists (throttle.py), and said over at the next contact. Permanent-looking answers
(Forbidden, NotFound: RBAC, a missing CRD) are ``permanent``: the reflector retries them with the
longer backoff cap, as access may be granted or the CRD installed later, and readiness says what
someone must do (``problem``).
"""

from __future__ import annotations

import logging

import msgspec

from ..client import protobuf
from ..client.api import ApiError, Forbidden, NotFound
from ..runtime.clock import Clock
from ..runtime.logfields import fields
from ..runtime.throttle import ThrottledLog

log = logging.getLogger("kubeindex.watch.reflector")  # a reflector's lines, whichever part says them
FAILURES = (ApiError, msgspec.DecodeError, protobuf.ProtobufError)  # a request's; any other error is a bug


def explain(err: Exception) -> str:
    """A failed request in words, for the log and ``last_error``."""
    if isinstance(err, NotFound):
        return "404 not found: the resource is not served (are this project's CRDs installed? kubectl apply -f crds/)"
    if isinstance(err, Forbidden):
        return f"{err.status} {err.reason}: check the credentials and RBAC ({err.message.strip()})"
    if isinstance(err, ApiError) and not err.status:
        return err.message  # no answer: the transport's own words
    return f"{type(err).__name__}: {str(err).strip()}"


def reason(err: Exception) -> str:
    """The ``reason`` label of nws_watch_restarts_total for a failed request."""
    if isinstance(err, ApiError):
        return f"http_{err.status}" if err.status else err.reason  # "timeout", or the transport's error
    return type(err).__name__


class Contact:
    def __init__(self, name: str, path: str, clock: Clock) -> None:
        self.name, self.path = name, path  # the reflector's, in the log
        self.clock = clock
        self._say = ThrottledLog(log, clock=clock.monotonic)
        self.connected = False  # the last request was answered
        self.lost_at = 0.0  # clock.monotonic() when the connection was lost (while not connected)
        self.failure: Exception | None = None  # what the last failed request raised (None since contact)
        self.last_error = ""  # the server's Status message, or what went wrong

    @property
    def forbidden(self) -> bool:
        """The last request was refused (401, 403): until someone changes RBAC or the credentials."""
        return isinstance(self.failure, Forbidden)

    @property
    def not_served(self) -> bool:
        """The last request found no resource (404): a CRD not (or no longer) installed."""
        return isinstance(self.failure, NotFound)

    @property
    def permanent(self) -> bool:
        """Failing in a way that repeats until someone acts (retried quietly, with the long backoff)."""
        return self.forbidden or self.not_served

    @property
    def last_error_status(self) -> int:
        """The HTTP status of the last failed request (0: none since contact, or no answer)."""
        return self.failure.status if isinstance(self.failure, ApiError) else 0

    def made(self) -> None:
        """The API server answered a LIST or WATCH with 200."""
        if self._say.clear("failure"):
            log.info("%s: API server reachable again after %.0fs", self.name, self.clock.monotonic() - self.lost_at,
                     extra=fields(self.name))
        self.connected = True
        self.failure = None
        self.last_error = ""

    def lost(self, err: Exception, verb: str) -> None:
        """A request (``verb``: LIST or WATCH) failed, or its connection went silent: recorded and
        logged (when its reason is new, or LOG_EVERY after the last line)."""
        if self.connected or not self.lost_at:
            self.lost_at = self.clock.monotonic()
        self.connected = False
        self.failure = err
        self.last_error = err.message.strip() if isinstance(err, ApiError) and err.status else explain(err)
        if isinstance(err, FAILURES):
            self._say("failure", reason(err), logging.WARNING, "%s: %s %s: %s; retrying with backoff", self.name, verb,
                      self.path, explain(err), extra=fields(self.name, error=explain(err)))
        else:  # a bug: the reflector starts again from a LIST
            self._say("failure", reason(err), logging.ERROR, "%s: unexpected error in %s %s; relisting after backoff",
                      self.name, verb, self.path, exc_info=err, extra=fields(self.name, error=err))

    def problem(self, grace: float, synced: bool) -> str | None:
        """Why a resource is not in sync (None: it is), ``synced`` once its first sync completed."""
        now = self.clock.monotonic()  # the clock lost_at was read on
        if self.forbidden:
            return f"forbidden ({self.last_error})"
        if self.not_served:
            return f"not installed ({self.last_error}: the resource is not served; is its CRD installed?)"
        if not synced:
            return "initial sync in progress" + (f" (last error: {self.last_error})" if self.last_error else "")
        if not self.connected and now - self.lost_at > grace:
            return f"no contact with the API server for {now - self.lost_at:.0f}s (last error: {self.last_error})"
        return None
