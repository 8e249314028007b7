"""vllm-ascend serving settings drawn from the vllm-ascend docs in the knowledge base.

1. The model's class comes from its config and code: multimodal (a vision / audio sub-config, a
   projector, image inputs in its code, a processor file), remote code (auto_map or modeling code in
   the folder), MoE (routed-expert counts), and its maximum length.
2. The knowledge base (its "serving" collection: the doc folders the user built it from, e.g. the
   vllm-ascend docs) is asked for serving guidance on models of that class. Each retrieved doc's own
   class is read from its text, and its serve script (the ``export`` lines and the ``vllm serve``
   flags) is parsed; the doc whose class agrees best with the model's, KB rank breaking ties, gives
   the settings. A variable it leaves out is looked up by name in the KB.
3. What the KB does not say falls back to the documented defaults below, and each such setting says so.

Every setting carries the doc it came from (path and chunk id). Nothing here is keyed on a model's
name: two models of the same class get the same settings from the same docs.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandbox.targets import DEFAULT_CHIP, doc_chip, serving_chip

# What serve.sh manages: the environment variables and the flags the vllm-ascend serving docs set.
ENV_VARS = ("VLLM_USE_V1", "TASK_QUEUE_ENABLE", "VLLM_ASCEND_ENABLE_NZ", "PYTORCH_NPU_ALLOC_CONF",
            "TOKENIZERS_PARALLELISM")
DOC_FLAGS = ("gpu-memory-utilization", "no-enable-prefix-caching", "mm-processor-cache-gb", "trust-remote-code",
             "additional-config")

# Used only when the knowledge base has no vllm-ascend serving docs; each names where it is documented.
DOCUMENTED_DEFAULTS: dict[str, tuple[Any, str]] = {
    "VLLM_USE_V1": ("1", "vLLM's V1 engine, the one vllm-ascend supports (vllm-ascend docs: tutorials)"),
    "PYTORCH_NPU_ALLOC_CONF": ("expandable_segments:True",
                               "vllm-ascend docs: developer_guide/performance_and_debug/optimization_and_tuning.md"),
    "TASK_QUEUE_ENABLE": ("1", "vllm-ascend docs: tutorials (single-node online deployment scripts)"),
    "gpu-memory-utilization": (0.9, "vLLM's default (vllm-ascend docs: --gpu-memory-utilization 'The default "
                                    "value is 0.9')"),
}

Search = Callable[[str, int], list[Any]]  # (query, k) -> KB hits (knowledge.kb.models.Hit)


class ModelClass(BaseModel):
    names: list[str] = []  # the config's architectures and model types: words for the KB query, never a key
    multimodal: bool = False
    remote_code: bool = False
    moe: bool = False
    max_len: int | None = None
    why: dict[str, str] = {}


_MM_CONFIG_KEYS = re.compile(r"^(vision|visual|image|audio|speech|projector|mm)_?|_(vision|image|audio)_|"
                             r"(vision|visual|image|audio)_(config|tower|encoder|token|size)")
_MM_CODE = re.compile(r"\b(pixel_values|image_embeds|images_seq_mask|images_spatial_crop|image_features)\b")
_MOE_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_LEN_KEYS = ("max_position_embeddings", "max_seq_len", "seq_length", "max_sequence_length", "n_positions")


def _walk(config: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in config.items():
        out.append((f"{prefix}{k}", v))
        if isinstance(v, dict):
            out += _walk(v, f"{prefix}{k}.")
    return out


def model_class(config: dict[str, Any], model_dir: Path | None = None) -> ModelClass:
    """The serving class of a model, from its config.json and the code in its folder."""
    flat = _walk(config)
    mc = ModelClass(names=sorted({str(v) for k, v in flat if k.rsplit(".", 1)[-1] in ("architectures", "model_type")
                                  and isinstance(v, str)} | {a for a in config.get("architectures") or []
                                                               if isinstance(a, str)}))
    mm_keys = [k for k, _ in flat if _MM_CONFIG_KEYS.search(k.rsplit(".", 1)[-1])]
    code = [p for p in model_dir.rglob("*.py")] if model_dir is not None and model_dir.is_dir() else []
    mm_code = next((f"{p.name} takes {m.group(1)}" for p in code
                    if (m := _MM_CODE.search(p.read_text(errors="replace")))), None)
    processor = [n for n in ("preprocessor_config.json", "processor_config.json")
                 if model_dir is not None and (model_dir / n).is_file()]
    if mm_keys or mm_code or processor:
        mc.multimodal = True
        mc.why["multimodal"] = "; ".join(filter(None, [f"config has {', '.join(mm_keys[:4])}" if mm_keys else "",
                                                       mm_code or "", ", ".join(processor)]))
    auto = config.get("auto_map")
    if auto or code:
        mc.remote_code = True
        mc.why["remote_code"] = "config.json has auto_map" if auto else f"modeling code in the folder ({code[0].name})"
    experts = [(k, v) for k, v in flat if k.rsplit(".", 1)[-1] in _MOE_KEYS and isinstance(v, int) and v > 1]
    if experts:
        mc.moe = True
        mc.why["moe"] = f"{experts[0][0]}={experts[0][1]}"
    lens = [(k, v) for k, v in flat if k.rsplit(".", 1)[-1] in _LEN_KEYS and isinstance(v, int) and v > 0]
    if lens:
        # The language model's length bounds a request (vision encoders carry their own, smaller ones).
        k, v = max(lens, key=lambda kv: kv[1])
        mc.max_len, mc.why["max_len"] = v, f"config.json {k}={v}"
    return mc


# ---------------------------------------------------------------------------------------------
# Reading the docs
# ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
_EXPORT = re.compile(r"^\s*export\s+([A-Z_][A-Z0-9_]*)=(\S+)\s*$", re.M)


@dataclass
class DocServe:
    """One retrieved doc: its class as its text shows it, and its first ``vllm serve`` script."""

    source: str
    chunk_id: str
    rank: int
    env: dict[str, str] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    multimodal: bool = False
    moe: bool = False
    remote_code: bool = False
    chip: str | None = None  # the chip the doc was written for alone (sandbox/targets: Chip.doc_words)

    @property
    def cite(self) -> str:
        return f"{self.source} (KB chunk {self.chunk_id})"


def parse_serve_script(text: str) -> tuple[dict[str, str], dict[str, Any]] | None:
    """(exports, flags) of the first code block that runs ``vllm serve``; None when the doc has none."""
    for block in _FENCE.findall(text):
        if "vllm serve" not in block:
            continue
        env = {k: v.strip("'\"") for k, v in _EXPORT.findall(block)}
        cmd = block[block.index("vllm serve"):].replace("\\\n", " ")
        try:
            argv = shlex.split(cmd, comments=True)
        except ValueError:
            continue
        flags: dict[str, Any] = {}
        i = 2
        while i < len(argv):
            tok = argv[i]
            if not tok.startswith("--"):
                i += 1
                continue
            name, _, inline = tok[2:].partition("=")
            name = name.replace("_", "-")
            if inline:
                flags[name] = inline
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[name] = argv[i + 1]
                i += 1
            else:
                flags[name] = True
            i += 1
        return env, flags
    return None


def _doc_text(hit: Any) -> str:
    path = Path(getattr(hit, "path", "") or "")
    try:
        return path.read_text(errors="replace") if path.is_file() else str(getattr(hit, "text", ""))
    except OSError:
        return str(getattr(hit, "text", ""))


def _doc_serve(hit: Any, rank: int) -> DocServe | None:
    text = _doc_text(hit)
    parsed = parse_serve_script(text)
    if parsed is None:
        return None
    env, flags = parsed
    low = text.lower()
    return DocServe(source=hit.source, chunk_id=hit.id, rank=rank, env=env, flags=flags,
                    multimodal="mm-processor-cache-gb" in flags or "limit-mm-per-prompt" in flags
                    or any(w in low for w in ("multimodal", "multi-modal", "vision", "image_url")),
                    moe=any(w in low for w in ("moe", "expert")), remote_code="trust-remote-code" in flags,
                    chip=doc_chip(low))


def class_query(mc: ModelClass) -> str:
    words = ["vllm serve single-node online deployment script export"]
    words.append("multimodal vision-language model images --mm-processor-cache-gb" if mc.multimodal
                 else "text-only dense language model")
    if mc.moe:
        words.append("MoE experts multistream_overlap_shared_expert")
    if mc.remote_code:
        words.append("--trust-remote-code")
    return " ".join(words + mc.names)


def _agreement(d: DocServe, mc: ModelClass, chip: str) -> tuple[int, int]:
    # Multimodal decides the most (processor cache, prefix caching of image tokens); then the chip the
    # doc was written for (memory settings differ on 310P), MoE, remote code.
    score = (8 * (d.multimodal == mc.multimodal) + 4 * (d.chip == serving_chip(chip)) + 2 * (d.moe == mc.moe)
             + (d.remote_code == mc.remote_code))
    return score, -d.rank


# ---------------------------------------------------------------------------------------------
# The settings
# ---------------------------------------------------------------------------------------------


class DocSetting(BaseModel):
    name: str
    value: Any
    kind: str  # "flag" | "env" | "additional_config"
    reason: str
    citation: str
    from_kb: bool


@dataclass
class ServePlan:
    model: ModelClass
    settings: list[DocSetting]
    docs: list[str]  # what the KB returned, best first
    note: str  # how the settings were found (KB docs, or documented defaults because the KB lacks them)


def default_search() -> Search | None:
    """The knowledge base's search over its serving collection, or None when no KB is usable."""
    from agents.reading.citations import kb_status

    if kb_status().startswith(("off", "not built")):
        return None
    try:
        from knowledge.kb import KnowledgeBase

        kb = KnowledgeBase()
        if not kb.counts().get("serving"):
            return None
    except Exception:  # a broken store must not stop the bundle; the plan says the KB was unusable
        return None
    return lambda query, k: kb.search(query, k=k, collections=["serving"])


def _class_docs(mc: ModelClass, search: Search | None) -> list[DocServe]:
    """The serving docs the knowledge base returns for the model's class, one per source, in rank order."""
    docs: list[DocServe] = []
    if search is None:
        return docs
    seen: set[str] = set()
    for rank, hit in enumerate(search(class_query(mc), 16)):
        if hit.source in seen:
            continue
        seen.add(hit.source)
        d = _doc_serve(hit, rank)
        if d is not None:
            docs.append(d)
    return docs


def plan_from_docs(mc: ModelClass, search: Search | None, chip: str = DEFAULT_CHIP) -> ServePlan:
    """The doc-derived settings for a model of class ``mc``."""
    docs = _class_docs(mc, search)
    docs.sort(key=lambda d: _agreement(d, mc, chip), reverse=True)
    best = next((d for d in docs if d.multimodal == mc.multimodal), None)
    out: list[DocSetting] = []
    cls = ", ".join(n for n, on in (("multimodal", mc.multimodal), ("MoE", mc.moe), ("remote code", mc.remote_code))
                    if on) or "text-only"
    if best is not None:
        note = (f"settings from {best.source}, the serving doc in the knowledge base whose model class agrees best "
                f"with this model's ({cls})")
        for name in ENV_VARS:
            if name in best.env:
                out.append(DocSetting(name=name, value=best.env[name], kind="env", citation=best.cite, from_kb=True,
                                      reason=f"set by the serve script of a {cls} model in the docs"))
        flag_rules = {"gpu-memory-utilization": True, "no-enable-prefix-caching": True,
                      "mm-processor-cache-gb": mc.multimodal, "trust-remote-code": mc.remote_code,
                      "additional-config": mc.moe == best.moe and mc.multimodal == best.multimodal}
        for name in DOC_FLAGS:
            if name in best.flags and flag_rules[name]:
                value = best.flags[name]
                if name == "additional-config":
                    try:
                        value = json.loads(value)
                    except (TypeError, json.JSONDecodeError):
                        continue
                out.append(DocSetting(name=name, value=value, kind="flag", citation=best.cite, from_kb=True,
                                      reason=f"set by the serve script of a {cls} model in the docs"))
        if "max-model-len" in best.flags:
            out.append(DocSetting(name="max-model-len", value=mc.max_len, kind="flag", from_kb=True,
                                  citation=f"{best.cite}; {mc.why.get('max_len', 'config.json')}",
                                  reason="the docs set --max-model-len, the sum of input and output tokens of one "
                                         "request; the value is this model's own maximum length"))
    else:
        note = ("the knowledge base has no vllm-ascend serving docs for a model of this class "
                f"({cls}): documented defaults are used (build it with `npuport kb build <vllm-ascend docs folder>`)"
                if search is None or not docs else
                f"no serving doc in the knowledge base matches this model's class ({cls}): documented defaults "
                "are used")
        note += f"; {would_read(mc)}"
    have = {s.name for s in out}
    # A variable the class doc leaves out: the next doc of the same class that sets it, else the KB asked
    # for it by name, else the documented default.
    for name in ENV_VARS[:4]:
        if name in have:
            continue
        other = next((d for d in docs if d.multimodal == mc.multimodal and name in d.env), None)
        if other is not None:
            out.append(DocSetting(name=name, value=other.env[name], kind="env", citation=other.cite, from_kb=True,
                                  reason=f"set by the serve script of another {cls} model in the docs"))
            continue
        found = _lookup_env(name, search, mc, chip) if search is not None else None
        if found is not None:
            value, cite = found
            out.append(DocSetting(name=name, value=value, kind="env", citation=cite, from_kb=True,
                                  reason="the KB's docs for this kind of model set it (no serve script of "
                                         "this class does)"))
        elif name in DOCUMENTED_DEFAULTS:
            value, where = DOCUMENTED_DEFAULTS[name]
            out.append(DocSetting(name=name, value=value, kind="env", citation=f"documented default: {where}",
                                  from_kb=False, reason="not in the knowledge base: documented default"))
    if "gpu-memory-utilization" not in have:
        value, where = DOCUMENTED_DEFAULTS["gpu-memory-utilization"]
        out.append(DocSetting(name="gpu-memory-utilization", value=value, kind="flag", from_kb=False,
                              citation=f"documented default: {where}",
                              reason="not in the knowledge base for this class: documented default"))
    if mc.remote_code and "trust-remote-code" not in have:
        out.append(DocSetting(name="trust-remote-code", value=True, kind="flag", citation="recipe:H10", from_kb=False,
                              reason=f"the model's classes live in its own folder ({mc.why.get('remote_code')})"))
    if "max-model-len" not in {s.name for s in out} and mc.max_len:
        out.append(DocSetting(name="max-model-len", value=mc.max_len, kind="flag", from_kb=False,
                              citation=mc.why.get("max_len", "config.json"),
                              reason="this model's own maximum length"))
    return ServePlan(model=mc, settings=out, docs=[d.source for d in docs], note=note)


def would_read(mc: ModelClass) -> str:
    """What a knowledge base with the vllm-ascend docs would set for this class, and which settings here are
    therefore npuport's defaults, not the docs' (the settings plan_from_docs takes from a class's serve script)."""
    flags = ["--gpu-memory-utilization", "--no-enable-prefix-caching"]
    if mc.multimodal:
        flags.append("--mm-processor-cache-gb")
    if mc.remote_code:
        flags.append("--trust-remote-code")
    if mc.moe or mc.multimodal:
        flags.append("--additional-config (e.g. multistream_overlap_shared_expert)")
    return ("with the docs, serve.sh would take from the serve script of a model of this class: "
            f"{', '.join(ENV_VARS[:4])} and {', '.join(flags)}; without them those are npuport's defaults or absent")


def _lookup_env(name: str, search: Search, mc: ModelClass, chip: str) -> tuple[str, str] | None:
    """The first ``export NAME=VALUE`` in a code block of the docs the KB returns for the name, from a doc
    written for the same kind of model (multimodal or not) and chip."""
    for rank, hit in enumerate(search(f"export {name}", 6)):
        d = _doc_serve(hit, rank)
        if d is not None and (d.multimodal != mc.multimodal or d.chip != serving_chip(chip)):
            continue
        for block in _FENCE.findall(_doc_text(hit)):
            m = re.search(rf"^\s*export\s+{name}=(\S+)\s*$", block, re.M)
            if m:
                return m.group(1).strip("'\""), f"{hit.source} (KB chunk {hit.id})"
    return None
