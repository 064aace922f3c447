"""The TLS certificate of the metrics server: from files (reloaded when they change, as a Secret or
cert-manager rotates them), or self-signed at start (a new one on every restart).

The self-signed certificate is made by the `openssl` command, which the image has (Debian's
ca-certificates depends on it), so the service needs no cryptography library of its own."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import shutil
import socket
import ssl
import subprocess

log = logging.getLogger(__name__)
SELF_SIGNED_DAYS = 365
RELOAD_SECONDS = 10.0


class CertificateError(Exception):
    """No usable certificate; the message says what to fix."""


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def self_signed_hosts() -> list[str]:
    """Names the certificate holds: loopback, this host and, in a pod, its IP ($POD_IP)."""
    hosts = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    if os.environ.get("POD_IP"):
        hosts.append(os.environ["POD_IP"])
    return list(dict.fromkeys(hosts))


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def self_signed_pem(hosts: list[str]) -> bytes:
    """A P-256 key and a certificate for ``hosts``, both PEM, in one block of bytes."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CertificateError("--metrics-secure: no --metrics-cert-file/--metrics-key-file and no openssl "
                               "command to make a self-signed certificate")
    # "-" writes the key and the certificate to stdout: nothing touches the (read-only) disk.
    cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc",
           "-keyout", "-", "-out", "-", "-days", str(SELF_SIGNED_DAYS), "-subj", "/CN=node-workload-summary",
           "-addext", "subjectAltName=" + ",".join(_san(h) for h in hosts)]
    proc = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise CertificateError(f"openssl could not make a self-signed certificate: {proc.stderr.decode()[-300:]}")
    return proc.stdout


def _stamp(*paths: str) -> tuple[tuple[int, int, int], ...]:
    # A Secret volume swaps a symlink: stat() follows it, so the inode and mtime change.
    return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, paths))


class CertFiles:
    """A certificate and key from files, loaded into ``context`` now and again when they change."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
        self.context, self.cert_file, self.key_file = context, cert_file, key_file
        try:
            self.stamp = _stamp(cert_file, key_file)
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as err:
            raise CertificateError(f"--metrics-cert-file {cert_file}, --metrics-key-file {key_file}: {err}") from None

    def reload_if_changed(self) -> bool:
        """True when new files were loaded; a broken pair is logged and the old one kept."""
        try:
            stamp = _stamp(self.cert_file, self.key_file)
            if stamp == self.stamp:
                return False
            # Only new connections use the new certificate: open ones keep theirs.
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as err:
            log.warning("metrics certificate: keeping the loaded one; cannot load %s: %s", self.cert_file, err)
            return False
        self.stamp = stamp
        log.info("metrics certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self, interval: float = RELOAD_SECONDS) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
