"""Inside a sandbox with no network: a local HTTP proxy port that forwards to the parent's index proxy.

Run as a script, not a module (``python -I -S netgate.py SOCKET -- ARGV...``): standard library only and
no imports of npuport, so it runs before anything of the environment does. It listens on 127.0.0.1 (the
sandbox's own loopback), relays every connection to the unix socket SOCKET (the parent's allow-list
proxy, sandbox/isolation/index_proxy.py, bound into the sandbox), and runs ARGV with HTTP(S)_PROXY pointing at it;
its exit status is ARGV's. Whatever ARGV does, it reaches only what the parent's proxy lets through.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either side ends, then shut both (the proxy's relay uses it too)."""
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    path, sep, *command = argv
    if sep != "--" or not command:
        print("usage: netgate.py SOCKET -- ARGV...", file=sys.stderr)
        return 2
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env = dict(os.environ)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = url
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
