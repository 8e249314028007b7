"""The stack a target runs (torch, torch_npu, CANN, Python), the model's pins merged one per package,
model pins on the framework that disagree with the target, and the vLLM / vllm-ascend pairing."""

from __future__ import annotations

import sys
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from agents.environment.compat import (
    NPU_TARGETS,
    companion_version,
    detect_cann,
    exact_version,
    host_version,
    torch_npu_row,
)
from agents.environment.pins import RANK, Pin
from agents.environment.torch_pair import release_of as _release
from sandbox.targets import get_target_spec


def merge_pins(name: str, pins: list[Pin], conflicts: list[str]) -> tuple[SpecifierSet, Pin]:
    """One specifier per package. The most authoritative exact pin wins; sources that disagree
    with it are reported and ignored."""
    ranked = sorted(pins, key=lambda p: RANK[p.kind])
    exact = next((p for p in ranked if any(s.operator in ("==", "===") for s in p.specifier)), None)
    lead = exact or ranked[0]
    merged = SpecifierSet()
    for pin in ranked:
        if exact is not None and pin is not exact:
            version = next(s.version for s in exact.specifier if s.operator in ("==", "==="))
            if pin.specifier and not pin.specifier.contains(version.rstrip(".*"), prereleases=True):
                conflicts.append(
                    f"{exact.source} pins {exact.requirement} but {pin.source} asks for {pin.requirement}; "
                    f"the port follows {exact.source}."
                )
                continue
        merged &= pin.specifier
    return merged, lead


def stack_for_target(
    target: str, torch_npu: str | None, compat: dict[str, Any], conflicts: list[str], notes: list[str]
) -> dict[str, str | None]:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    host_torch = host_version("torch")
    stack: dict[str, str | None] = {"python": py, "torch": host_torch and _release(host_torch),
                                    "torch_npu": None, "cann": None}
    if target not in NPU_TARGETS or not torch_npu:
        notes.append(f"target {target} runs on the host's torch {host_torch}; no torch_npu or CANN involved.")
        return stack
    row = torch_npu_row(torch_npu, compat)
    stack["torch_npu"] = torch_npu
    if row is None:
        conflicts.append(f"torch_npu {torch_npu} is not in the compatibility table, so its torch and CANN "
                         "versions are unknown; pick a listed torch_npu release or add its row to "
                         "agents/data/compat.yaml.")
        return stack
    need_torch = row["torch"]
    stack["torch"] = need_torch
    stack["cann"] = " or ".join(row["cann"]) or None
    if row.get("note"):
        notes.append(f"torch_npu {torch_npu}: {row['note']}.")
    if host_torch and _release(host_torch) != need_torch:
        where = ("the emulator runs it on the host's torch, so op coverage is that of the matrix but "
                 "numerics are the host torch's" if get_target_spec(target).emulated else "install the matching torch")
        conflicts.append(f"torch_npu {torch_npu} needs torch {need_torch}, but this host runs torch {host_torch} "
                         f"({where}).")
    pythons = compat.get("torch_python", {}).get(need_torch)
    if pythons and py not in pythons:
        conflicts.append(f"torch {need_torch} (for torch_npu {torch_npu}) supports Python {', '.join(pythons)}, "
                         f"but this host runs Python {py}.")
    cann = detect_cann()
    if get_target_spec(target).emulated:
        needs = f"CANN {stack['cann']}" if stack["cann"] else "the CANN release its build names (not in the tables yet)"
        notes.append(f"{target} needs no CANN; a real Ascend host needs {needs} for torch_npu {torch_npu}.")
    elif cann and row["cann"] and cann not in row["cann"]:
        conflicts.append(f"torch_npu {torch_npu} is published for CANN {' or '.join(row['cann'])}, but the installed "
                         f"CANN is {cann}; install a torch_npu build made for CANN {cann} or the matching CANN.")
    elif cann:
        stack["cann"] = cann
    return stack


def framework_conflict(name: str, spec: SpecifierSet, lead: Pin, stack: dict[str, str | None],
                        target: str, compat: dict[str, Any]) -> str | None:
    """Plain words when a model pin on torch and friends disagrees with what the target runs."""
    torch_v = stack.get("torch")
    if not torch_v or not spec:
        return None
    if name == "torch" and not spec.contains(torch_v, prereleases=True):
        who = f"torch_npu {stack['torch_npu']} needs torch {torch_v}" if stack.get("torch_npu") \
            else f"the {target} target runs the host's torch {torch_v}"
        return f"{who}, but the model pins {lead.requirement} ({lead.source}); the port runs on torch {torch_v}."
    if name in ("torchvision", "torchaudio"):
        line = companion_version(name, torch_v, compat)
        if line and not spec.contains(line.replace(".*", ".0"), prereleases=True):
            return (f"the model pins {lead.requirement} ({lead.source}), which is built for another torch; "
                    f"torch {torch_v} pairs with {name} {line}, which the port uses.")
    if name == "torch-npu" and stack.get("torch_npu") and not spec.contains(stack["torch_npu"] or "", prereleases=True):
        return f"the model pins {lead.requirement} ({lead.source}) but the port targets torch_npu {stack['torch_npu']}."
    return None


def _vllm_ascend_for(vllm_spec: SpecifierSet | None, torch_npu: str | None,
                     compat: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    rows: dict[str, dict[str, Any]] = compat.get("vllm_ascend", {})
    ordered = sorted(rows.items(), key=lambda kv: Version(kv[0]), reverse=True)
    if vllm_spec:
        return next(((v, r) for v, r in ordered if vllm_spec.contains(r["vllm"], prereleases=True)), None)
    if torch_npu:
        return next(((v, r) for v, r in ordered if _release(r["torch_npu"]) == _release(torch_npu)), None)
    return None


def resolve_vllm(merged: dict[str, tuple[SpecifierSet, Pin]], stack: dict[str, str | None],
                  compat: dict[str, Any], conflicts: list[str], notes: list[str]) -> None:
    if "vllm" not in merged and "vllm-ascend" not in merged:
        return
    vllm_spec = merged["vllm"][0] if "vllm" in merged else None
    if "vllm-ascend" in merged and merged["vllm-ascend"][0]:
        spec = merged["vllm-ascend"][0]
        hit = next(((v, r) for v, r in compat.get("vllm_ascend", {}).items()
                    if spec.contains(v, prereleases=True)), None)
    else:
        hit = _vllm_ascend_for(vllm_spec, None if vllm_spec else stack.get("torch_npu"), compat)
    if hit is None:
        newest_v, newest = max(compat["vllm_ascend"].items(), key=lambda kv: Version(kv[0]))
        wanted = f"vLLM {vllm_spec}" if vllm_spec else f"torch_npu {stack.get('torch_npu')}"
        conflicts.append(
            f"no published vllm-ascend release pairs with {wanted} (the newest, v{newest_v}, runs vLLM "
            f"{newest['vllm']} on torch {newest['torch']} / torch_npu {newest['torch_npu']} and CANN "
            f"{newest['cann']}); serving with vLLM on Ascend needs that stack."
        )
        return
    version, row = hit
    stack["vllm"], stack["vllm_ascend"] = row["vllm"], version
    notes.append(f"vllm-ascend {version} plugs into vLLM {row['vllm']} and was tested on torch_npu {row['torch_npu']}, "
                 f"CANN {row['cann']}, Python {row['python']}.")
    if stack.get("torch_npu") and _release(row["torch_npu"]) != _release(stack["torch_npu"] or ""):
        conflicts.append(f"vllm-ascend {version} (for vLLM {row['vllm']}) needs torch_npu {row['torch_npu']} with "
                         f"torch {row['torch']}, but the port targets torch_npu {stack['torch_npu']}; serve the port "
                         "with that stack, or run it without vLLM.")
    py = stack.get("python") or ""
    if not SpecifierSet(row["python"]).contains(py + ".0"):
        conflicts.append(f"vllm-ascend {version} supports Python {row['python']}, but this host runs Python {py}.")
    needs_tf = compat.get("vllm", {}).get(row["vllm"], {}).get("transformers")
    if needs_tf and "transformers" in merged:
        spec, lead = merged["transformers"]
        exact = exact_version(spec)
        if exact and not SpecifierSet(needs_tf).contains(exact, prereleases=True):
            conflicts.append(f"the model pins {lead.requirement} ({lead.source}) but vLLM {row['vllm']} "
                             f"(for vllm-ascend {version}) needs transformers{needs_tf}; the sandbox keeps the model's "
                             "pin, and serving it with vLLM needs the model ported to a newer transformers.")

