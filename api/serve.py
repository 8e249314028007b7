"""``npuport serve``: run the HTTP service with uvicorn.  ``python -m api.serve --port 8000``."""

from __future__ import annotations

import argparse
import secrets
import sys

from api.settings import Settings


def serve(host: str = "127.0.0.1", port: int = 8000, *, settings: Settings | None = None,
          log_level: str = "info") -> None:
    """Serve the API on host:port. With no token configured, one read+write token is made up for
    this process and printed, so a fresh install is usable and never open."""
    import uvicorn

    from api.app import create_app

    settings = settings or Settings()
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::") else host
    url = f"http://{shown}:{port}/"
    if not settings.tokens:
        token = secrets.token_urlsafe(24)
        settings = settings.model_copy(update={"tokens": {token: ["read", "write"]}})
        print(f"npuport: no NPUPORT_TOKENS set; this run's token (read, write): {token}", file=sys.stderr, flush=True)
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
