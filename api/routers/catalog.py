"""What clients discover before they submit: ``GET /v1/models`` (OpenAI's model list: chat front-ends
such as Open WebUI list models before they connect) and ``GET /v1/options`` (targets, chips, policies
and defaults: the web page builds its controls from these, never from a hard-coded list)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel

from api.auth import Principal, require
from api.routers.chat import MODEL_NAME

router = APIRouter(prefix="/v1", tags=["catalog"])
Reader = Annotated[Principal, Depends(require("read"))]
_CREATED = int(time.time())


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class Options(BaseModel):
    targets: list[str]
    chips: list[str]
    policies: list[str]
    objectives: list[str]
    defaults: dict[str, Any]
    example_goal: str = ""
    """A goal this server accepts as written (a folder under its model roots), for the page's placeholder;
    empty when it has no model roots (uploads only)."""


def _model() -> Model:
    return Model(id=MODEL_NAME, created=_CREATED, owned_by="npuport")


@router.get("/models", response_model=ModelList)
def list_models(_: Reader) -> ModelList:
    """OpenAI-compatible model list: one model, ``npuport``, the porting agent behind chat completions."""
    return ModelList(data=[_model()])


@router.get("/models/{model_id}", response_model=Model, responses={404: {"description": "unknown model"}})
def get_model(model_id: str, _: Reader) -> Model:
    if model_id != MODEL_NAME:
        raise HTTPException(status_code=404, detail=f"no model {model_id}; the only one is {MODEL_NAME}")
    return _model()


def example_goal(roots: list[Path]) -> str:
    """A goal naming the first model folder under the first model root that has one."""
    for root in roots:
        try:
            folder = min((p for p in root.expanduser().iterdir() if p.is_dir() and not p.name.startswith(".")),
                         default=None)
        except OSError:
            continue
        if folder is not None:
            return f"port the model in {folder.name} to Ascend 910B on the cpu"
    return ""


@router.get("/options", response_model=Options)
def options(_: Reader, request: Request) -> Options:
    """The choices a port request accepts (the target registry, and agents.request.PortRequest itself)."""
    from typing import get_args

    from agents.request import POLICIES, PortRequest

    fields = PortRequest.model_fields

    def choices(name: str) -> list[str]:
        return [str(a) for a in get_args(fields[name].annotation)]

    from sandbox.targets import chip_names, target_names

    # targets and chips come from the target registry, policies from their list; the rest are Literal
    # fields of the request
    return Options(targets=list(target_names()), chips=list(chip_names()), policies=list(POLICIES),
                   objectives=choices("objective"),
                   defaults={k: fields[k].default
                             for k in ("target", "chip", "policy", "objective", "tune", "torch_npu")},
                   example_goal=example_goal(list(request.app.state.settings.allowed_roots)))
