"""The parent's allow-list proxy for sandboxed package installs: network only to the package index.

A pip run in the sandbox has no network of its own (a new network namespace); its HTTP(S) proxy is
sandbox/isolation/netgate.py inside the sandbox, which relays to this proxy's unix socket. This proxy, in npuport's
process, lets through ``CONNECT host:port`` (HTTPS) and absolute-form requests (plain HTTP) only to the
(host, port) pairs it was given (the configured index and find-links hosts), answers 403 to anything
else, and is closed when the install ends. Names are resolved here, on the host.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from sandbox.isolation.netgate import pump

MAX_HEAD = 16 * 1024
CONNECT_TIMEOUT_S = 30.0


class IndexProxy:
    """``with IndexProxy({("pypi.org", 443)}) as proxy:`` -> ``proxy.path`` is its unix socket."""

    def __init__(self, allowed: set[tuple[str, int]]) -> None:
        self.allowed = {(h.lower().strip("[]"), int(p)) for h, p in allowed}
        self._dir = Path(tempfile.mkdtemp(prefix="npuport-index-"))
        self.path = self._dir / "proxy.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        self._sock.listen(64)
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True, name="npuport-index-proxy")
        self._thread.start()

    def __enter__(self) -> IndexProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            line, _, rest = head.partition(b"\r\n")
            method, target, version = (line.decode("latin-1").split(" ") + ["", "", ""])[:3]
            if method.upper() == "CONNECT":
                host, _, port = target.rpartition(":")
                dest = (host.strip("[]").lower(), int(port) if port.isdigit() else 443)
                upstream = self._open(client, dest, target)
                if upstream is None:
                    return
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                after = head.partition(b"\r\n\r\n")[2]
                if after:
                    upstream.sendall(after)
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    self._deny(client, target, "only absolute http:// requests and CONNECT are proxied")
                    return
                dest = (url.hostname.lower(), url.port or 80)
                upstream = self._open(client, dest, target)
                if upstream is None:
                    return
                path = url.path or "/"
                if url.query:
                    path += "?" + url.query
                upstream.sendall(f"{method} {path} {version}".encode("latin-1") + b"\r\n" + rest)
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
            pump(client, upstream)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _open(self, client: socket.socket, dest: tuple[str, int], target: str) -> socket.socket | None:
        if dest not in self.allowed:
            self._deny(client, target, "not a package index this install may reach")
            return None
        try:
            return socket.create_connection(dest, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            client.sendall(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n{exc}".encode()[:200])
            return None

    def _deny(self, client: socket.socket, target: str, why: str) -> None:
        if len(self.refused) < 100:
            self.refused.append(f"{target[:200]}: {why}")
        body = f"npuport: {target[:200]} refused: {why}\n".encode()
        client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def hosts_of(urls: list[str]) -> set[tuple[str, int]]:
    """(host, port) of the http(s) URLs among ``urls``."""
    out: set[tuple[str, int]] = set()
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme in ("http", "https") and parts.hostname:
            with contextlib.suppress(ValueError):
                out.add((parts.hostname.lower(), parts.port or (443 if parts.scheme == "https" else 80)))
    return out


@contextlib.contextmanager
def index_proxy(allowed: set[tuple[str, int]]) -> Iterator[IndexProxy | None]:
    """A proxy for ``allowed`` while the block runs; None when nothing is to be reached."""
    if not allowed:
        yield None
        return
    proxy = IndexProxy(allowed)
    try:
        yield proxy
    finally:
        proxy.close()
