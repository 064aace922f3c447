"""A loopback TCP proxy in front of kube-apiserver for fault tests: it can make the connections it
carries go silent without closing them (a dead peer behind a NAT or load balancer), which only a
client-side read timeout can notice. TLS passes through untouched."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path

from .cluster import LocalCluster, free_port


class StallingProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = listen_host  # a real node's pods reach it at the node's address (localkube.node)
        self.port = free_port()
        self._server = socket.create_server((listen_host, self.port))
        self._lock = threading.Lock()
        self._connections: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._closed = False
        self._stall_new = False
        threading.Thread(target=self._accept, daemon=True).start()

    def stall_existing(self) -> int:
        """Stop forwarding on every connection open now (they stay open); returns how many.
        New connections are not affected."""
        with self._lock:
            for _, _, stalled in self._connections:
                stalled.set()
            return len(self._connections)

    def stall_all(self) -> None:
        """Stall every connection, the ones open now and every new one: the API server looks
        hung (connections are accepted, nothing ever answers)."""
        self._stall_new = True
        self.stall_existing()

    def resume(self) -> None:
        """New connections are carried again. Those stalled stay silent: only their client's read
        timeout ends them, as after a real network outage."""
        self._stall_new = False

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for client, upstream, _ in self._connections:
                for s in (client, upstream):
                    s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            stalled = threading.Event()
            if self._stall_new:
                stalled.set()
            with self._lock:
                self._connections.append((client, upstream, stalled))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, stalled), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, stalled: threading.Event) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if stalled.is_set():
                    continue  # swallow: the other side hears nothing, and nothing closes
                dst.sendall(data)
        except OSError:
            pass
        if not stalled.is_set():
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def through_proxy(cluster: LocalCluster, name: str = "proxied") -> tuple[StallingProxy, Path]:
    """A StallingProxy in front of ``cluster``'s API server, and a kubeconfig that goes through it."""
    proxy = StallingProxy("127.0.0.1", int(cluster.server.rsplit(":", 1)[1]))
    config = json.loads(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path = cluster.workdir / f"{name}.kubeconfig"
    path.write_text(json.dumps(config))
    return proxy, path
