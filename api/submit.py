"""Turning what a client sent (goal text, structured fields, an uploaded archive) into a job."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api.jobs import Job, JobManager, body_digest, make_job
from api.shares import check_queue, upload_room
from api.uploads import confine_model_path, extract_archive
from knowledge.errors import SubmitError, UploadError
from knowledge.settings import ServiceSettings as Settings

ROOTS_HINT = ("start `npuport serve --model-root /path/to/models` (or set NPUPORT_ALLOWED_ROOTS=/path/a:/path/b) "
              "and name a folder under it, or upload the model as an archive (the page, or POST /v1/ports)")
"""How a model folder on the server's disk becomes portable: said when none can be (no model roots)."""


def build_request(settings: Settings, goal: str, fields: dict[str, Any], uploaded_model: Path | None) -> dict[str, Any]:
    """A validated PortRequest dict whose model folder is an upload or lies under an allowed root."""
    from agents.request import PortRequest, parse_goal
    from knowledge.errors import GoalError

    fields = dict(fields)
    if fields.get("out_dir") is not None:
        raise SubmitError("request.out_dir is chosen by the server (the bundle is served at /v1/ports/{id}/bundle)")
    fields.pop("out_dir", None)
    if uploaded_model is not None:
        fields["model_path"] = str(uploaded_model)
    elif goal.strip() and not fields.get("model_path") and (found := _model_in_goal(goal, settings)):
        fields["model_path"] = found
    try:
        req = parse_goal(goal, fields) if goal.strip() else PortRequest(**fields)
    except GoalError as exc:
        raise SubmitError(str(exc)) from exc
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors())
        raise SubmitError(f"invalid request: {msgs}") from exc
    except TypeError as exc:
        raise SubmitError(f"invalid request: {exc}") from exc
    if uploaded_model is None:
        try:
            req = req.model_copy(update={"model_path": str(confine_model_path(req.model_path, settings.allowed_roots))})
        except UploadError as exc:
            raise SubmitError(str(exc), exc.status_code) from exc
    return req.model_dump()


_GOAL_PATH = re.compile(r"\b(?:in|at|from)\s+(?:the\s+)?(?:folder\s+|directory\s+)?(\S+)", re.I)


def _model_in_goal(goal: str, settings: Settings) -> str | None:
    """The first folder named in the goal that lies under an allowed root ("port the model in m1 ...");
    the planner alone would only see names that exist relative to the server's working directory."""
    for cand in _GOAL_PATH.findall(goal) + [w for w in goal.split() if "/" in w]:
        cand = cand.rstrip(".,;:")
        try:
            return str(confine_model_path(cand, settings.allowed_roots))
        except UploadError:
            continue
    return None


def save_upload(settings: Settings, data: bytes, filename: str, max_bytes: int | None = None) -> tuple[Path, Path]:
    """Unpack an uploaded archive under <home>/uploads/<id>/ (at most ``max_bytes``: the owner's room on the
    disk); returns (upload folder, model folder)."""
    dest = settings.resolved_home() / "uploads" / uuid.uuid4().hex
    try:
        model = extract_archive(data, filename, dest / "model", max_bytes=max_bytes or settings.max_extracted_bytes,
                                max_members=settings.max_archive_members)
    except UploadError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise SubmitError(str(exc), exc.status_code) from exc
    return dest, model


def submit_job(manager: JobManager, *, owner: str, goal: str, fields: dict[str, Any], require_approval: bool = False,
               archive: tuple[bytes, str] | None = None, conversation: str | None = None,
               idem_key: str | None = None, digest_of: Any = None) -> tuple[Job, bool]:
    """Create and queue a job. With an ``idem_key`` this owner used before, return that job when the
    body is the same, and fail with 409 when it differs."""
    settings = manager.settings
    digest = body_digest(digest_of) if idem_key else None
    if idem_key:
        existing = manager.store.find_idem(owner, idem_key)
        if existing is not None:
            return _replay(existing, digest, idem_key), False
    uploaded = None
    if archive is not None:  # within the queue's and this owner's disk share, checked before unpacking
        check_queue(manager.store, settings, owner)
        uploaded = save_upload(settings, *archive, max_bytes=upload_room(manager.store, settings, owner))
    try:
        request = build_request(settings, goal, fields, uploaded[1] if uploaded else None)
        job = make_job(goal=goal, request=request, owner=owner, require_approval=require_approval,
                       conversation=conversation, upload_dir=str(uploaded[0]) if uploaded else None,
                       home=settings.resolved_home(), digest=digest)
        stored, created = manager.submit(job, idem_key)
    except BaseException:
        if uploaded:
            shutil.rmtree(uploaded[0], ignore_errors=True)
        raise
    if not created:  # a concurrent twin won the race for this key
        if uploaded:
            shutil.rmtree(uploaded[0], ignore_errors=True)
        return _replay(stored, digest, idem_key or ""), False
    return stored, True


def _replay(existing: Job, digest: str | None, idem_key: str) -> Job:
    if existing.idem_digest != digest:
        raise SubmitError(f"Idempotency-Key {idem_key!r} was already used for a different request (job {existing.id})",
                          409)
    return existing
