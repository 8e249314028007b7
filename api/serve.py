"""``npuport serve``: run the HTTP service with uvicorn.  ``python -m api.serve --port 8000``."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from api.submit import ROOTS_HINT
from knowledge.settings import ServiceSettings as Settings

TOKEN_FILE = "serve-token"


def home_token(home: Path) -> tuple[str, Path, bool]:
    """(token, file, made now): the token of `npuport serve` without NPUPORT_TOKENS, kept in the home
    (mode 0600) so that it, and the jobs its owner sees, survive a restart."""
    path = home / TOKEN_FILE
    if path.is_file() and not path.is_symlink() and (token := path.read_text().strip()):
        return token, path, False
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token, path, True


def serve(host: str = "127.0.0.1", port: int = 8000, *, settings: Settings | None = None,
          log_level: str = "info", roots: list[Path] | None = None) -> None:
    """Serve the API on host:port. With no token configured, one read+write token is made once, kept
    in the home and printed, so a fresh install is usable, never open, and the same after a restart."""
    import uvicorn

    from agents.doors import mark_service
    from api.app import create_app

    mark_service()  # this process serves: the planner confines every port to the roots (agents/doors.py)
    settings = settings or Settings()
    if roots:
        settings = settings.model_copy(update={"allowed_roots": [r.expanduser().resolve() for r in roots]})
    if settings.allowed_roots:
        print(f"npuport: model folders under {', '.join(map(str, settings.allowed_roots))} can be ported by path "
              "(the chat, POST /v1/ports)", file=sys.stderr, flush=True)
    else:
        print(f"npuport: no model roots: models come as uploaded archives; to port folders by path, {ROOTS_HINT}",
              file=sys.stderr, flush=True)
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::") else host
    url = f"http://{shown}:{port}/"
    if not settings.tokens:
        token, path, made = home_token(settings.resolved_home())
        settings = settings.model_copy(update={"tokens": {token: ["read", "write"]}})
        print(f"npuport: no NPUPORT_TOKENS set; the token (read, write) {'made and ' if made else ''}kept in "
              f"{path}: {token}", file=sys.stderr, flush=True)
        # the token rides in the fragment, which the browser never sends to the server
        print(f"npuport: open {url}#token={token}", file=sys.stderr, flush=True)
    else:
        print(f"npuport: open {url} (paste a token from NPUPORT_TOKENS)", file=sys.stderr, flush=True)
    print(f"npuport: API docs at {url}docs (offline assets)", file=sys.stderr, flush=True)
    # timeout_keep_alive bounds idle connections; the body timeout is BodyLimitMiddleware's
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, timeout_keep_alive=10)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m api.serve", description="Serve the npuport HTTP API.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    serve(args.host, args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
