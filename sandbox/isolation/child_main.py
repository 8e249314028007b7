"""The entry of a sandboxed child that answers one spec with one JSON result (sandbox/serving/reference.py,
sandbox/serving/client.py): the spec file from argv, the result over the parent's channel
(HARNESS_RESULT_FD, taken and made non-inheritable before any model code runs, so a server or model
process started below cannot write it), stdout when run by hand. Standard library only: it runs in
any layered environment."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def child_main(run: Callable[[dict[str, Any]], dict[str, Any]], on_error: Callable[[BaseException], dict[str, Any]],
               argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    fd = os.environ.pop("HARNESS_RESULT_FD", None)
    channel = os.fdopen(int(fd), "wb", closefd=True) if fd is not None else None
    if channel is not None:
        os.set_inheritable(channel.fileno(), False)
    try:
        result = run(spec)
    except BaseException as exc:  # reported as data: the parent reads the failure from the result
        result = on_error(exc)
    payload = json.dumps(result, default=str).encode()
    if channel is None:
        sys.stdout.buffer.write(payload + b"\n")
    else:
        with channel:
            channel.write(payload)
    return 0 if result.get("ok") else 1
