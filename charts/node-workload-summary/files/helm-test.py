"""`helm test`: the service answers /readyz with 200, and /metrics to this pod's ServiceAccount token
(bound to the metrics reader role) with 200 and its families, and, when secure, to no token with 401.
Run by the chart's test pod with the image's own Python; it reads only its environment:
READYZ_URL and METRICS_URL (the Service's address from the kubelet's service variables), SECURE
("true"/"false"), TOKEN_FILE; TIMEOUT (seconds, default 60)."""

from __future__ import annotations

import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def bracketed(url: str) -> str:
    """The URL with an IPv6 host in brackets: the kubelet's SERVICE_HOST is a bare address."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, _, port = netloc.rpartition(":")
    if ":" in host and not host.startswith("["):
        netloc = f"[{host}]:{port}"
    return f"{scheme}://{netloc}{slash}{path}"


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(bracketed(url), headers={"Authorization": f"Bearer {token}"} if token else {})
    # The certificate is self-signed at every start unless metrics.certSecret names one: the check
    # here is the token's, not the certificate's.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def check() -> list[str]:
    """What is wrong, or nothing."""
    problems = []
    status, body = get(os.environ["READYZ_URL"])
    if status != 200:
        problems.append(f"GET {os.environ['READYZ_URL']}: {status} {body.strip()}")
    secure = os.environ.get("SECURE", "true") == "true"
    token = Path(os.environ["TOKEN_FILE"]).read_text().strip() if secure else None
    status, body = get(os.environ["METRICS_URL"], token)
    if status != 200 or "nws_build_info" not in body:
        problems.append(f"GET {os.environ['METRICS_URL']} with the token: {status} {body[:300].strip()}")
    if secure:
        status, body = get(os.environ["METRICS_URL"])
        if status != 401:
            problems.append(f"GET {os.environ['METRICS_URL']} without a token: {status}, not 401")
    return problems


def unexpanded() -> list[str]:
    """URLs still holding a `$(VAR)`: the kubelet had no such service variable to expand."""
    return [f"{name}={os.environ[name]}: the Service's variables were not given to this pod (is the Service"
            " in this namespace, and enableServiceLinks on?)"
            for name in ("READYZ_URL", "METRICS_URL") if "$(" in os.environ[name]]


def main() -> int:
    if problems := unexpanded():
        print("\n".join(problems), file=sys.stderr)
        return 1
    deadline = time.monotonic() + float(os.environ.get("TIMEOUT", "60"))
    while True:
        try:
            problems = check()
        except OSError as err:  # not listening yet, or the Service has no ready endpoint
            problems = [f"{type(err).__name__}: {err}"]
        if not problems:
            print(f"ok: {os.environ['READYZ_URL']} and {os.environ['METRICS_URL']}")
            return 0
        if time.monotonic() > deadline:
            print("\n".join(problems), file=sys.stderr)
            return 1
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
