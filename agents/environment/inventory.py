"""Dynamic op inventory: run a model once on the target under the op guard and summarise which ops
have NPU kernels, which fall back to the CPU (with call sites in the model's files), dtype problems
and host syncs per step. Unported code runs with cuda redirected to the target's device, as
torch_npu's transfer_to_npu would, so a user learns this before porting."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.reading.entry import discover_entry
from agents.runs import RunSpec
from agents.target_state import matrix_for
from sandbox.isolation.process import Limits
from sandbox.targets import DEFAULT_CHIP, DEFAULT_TORCH_NPU, EMULATED_TARGET, get_target_spec, resolve_target


@dataclass
class Inventory:
    target: str
    reason: str
    ok: bool
    error: str = ""
    op_stats: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    tokens: list[list[int]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "reason": self.reason, "ok": self.ok, "error": self.error,
                "op_stats": self.op_stats, "warnings": self.warnings, "tokens": self.tokens}


def _relative_sites(sites: dict[str, int], model_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    prefix = str(model_dir.resolve()) + "/"
    for site, n in sites.items():
        out[site.replace(prefix, "")] = out.get(site.replace(prefix, ""), 0) + n
    return out


def _relativise(stats: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    for info in (stats.get("fallbacks") or {}).values():
        if isinstance(info, dict) and isinstance(info.get("sites"), dict):
            info["sites"] = _relative_sites(info["sites"], model_dir)
    prefix = str(model_dir.resolve()) + "/"
    for ev in stats.get("dtype_events") or []:
        if isinstance(ev, dict) and isinstance(ev.get("site"), str):
            ev["site"] = ev["site"].replace(prefix, "")
    syncs = stats.get("host_syncs")
    if isinstance(syncs, dict) and isinstance(syncs.get("sites"), dict):
        syncs["sites"] = _relative_sites(syncs["sites"], model_dir)
    return stats


def op_inventory(model_dir: Path, *, target: str = EMULATED_TARGET, chip: str = DEFAULT_CHIP,
                 torch_npu: str = DEFAULT_TORCH_NPU,
                 strict: bool = False, timeout_s: float = 300.0) -> Inventory:
    entry = discover_entry(model_dir).as_manifest_dict()
    matrix_path, note = matrix_for(torch_npu) if get_target_spec(target).uses_matrix else (None, "")
    t = resolve_target(target, chip=chip, torch_npu=torch_npu, strict=strict, matrix_path=matrix_path)
    reason = "; ".join(x for x in (t.reason, note) if x)
    with tempfile.TemporaryDirectory(prefix="npuport-ops-") as tmp:
        spec = RunSpec.of(workdir=Path(tmp), model_dir=model_dir, manifest=entry, target=t,
                          limits=Limits(wall_s=timeout_s)).replace(redirect_cuda=True)
        run = spec.harness(Path(tmp) / "run")
    res = run.result
    exc = res.get("exception") or {}
    error = f"{exc.get('type')}: {str(exc.get('message', ''))[:2000]}" if exc else ""
    return Inventory(target=t.name, reason=reason, ok=run.ok, error=error,
                     op_stats=_relativise(dict(res.get("op_stats") or {}), model_dir),
                     warnings=list(res.get("warnings") or []), tokens=(res.get("outputs") or {}).get("tokens"))
