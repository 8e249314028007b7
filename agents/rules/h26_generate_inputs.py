"""H26: a call on the generate path that needs an input the model's own code builds. npuport's made-up inputs
(token ids of the signature's names) miss what the model's input-building code adds:
``TypeError: prepare_inputs_for_generation() missing 1 required positional argument: 'token_type_ids'`` (a
vision-language model whose generate needs token types its own ``build_*_inputs`` method makes);
``ValueError: 32001 is not in list`` (the model looks for its image-start token, a config id, in a prompt that
has none); an ``AssertionError`` in the model's own input check on the generate path.

The fix is not a code patch: the inputs are rebuilt with the model's own input-building code (a method of the
model's classes whose returned dict holds the needed names, the folder's processor), never made up
(sandbox/inputs/own_inputs.py, driven from sandbox/harness/feeding.py), for the port and the reference alike.
The debugger names the fix ``rebuild-inputs``; the patcher records it in the run's manifest (no commit) and
the report lists it as an inputs fix. One hazard class, one module (see docs/rules.md)."""

from __future__ import annotations

import re

from agents.models import Frame, StructuredException
from agents.rules.base import BLOCKS, LOW, ErrorPattern, HazardRule, Signature, at_where
from agents.rules.context import ModuleContext

HAZARD = "H26"
INPUTS_FIX = "rebuild-inputs"  # a fix of the run's inputs (the manifest), not of the code
REBUILD_FAILED = "rebuild-inputs: "  # how the harness's message starts when the model's own code could not
_MISSING_ARGS = re.compile(r"([\w.<>]+)\(\) missing \d+ required (?:positional|keyword-only) arguments?: (.+)$")
_NOT_IN_LIST = re.compile(r"^(-?\d+) is not in list$")
_IDENT = re.compile(r"^[A-Za-z_][\w.]*$")
# Functions of transformers' generate loop: a frame of one of these puts the failure on the generate path.
GENERATE_FUNCS = frozenset({"generate", "_sample", "sample", "greedy_search", "_greedy_search", "_beam_search",
                            "beam_search", "_assisted_decoding", "prepare_inputs_for_generation",
                            "_prepare_model_inputs", "_prepare_cache_for_generation", "chat", "stream_chat"})


def on_generate_path(exc: StructuredException) -> bool:
    """A frame of the traceback is generate's (transformers' loop, or the model's own generate/chat)."""
    return any(f.func in GENERATE_FUNCS or "generation/utils.py" in f.file for f in exc.frames)


def _signature(kind_key: str, summary: str, frame: Frame | None, needs: list[str], why: str,
               token: int | None = None) -> Signature:
    return Signature("generate-inputs", f"generate-inputs:{kind_key}", summary, frame,
                     {"action": INPUTS_FIX, "params": {"needs": needs, "token": token, "why": why}})


def _generate_inputs(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    hints = exc.hints or {}
    if exc.type == "TypeError" and (m := _MISSING_ARGS.search(exc.message)):
        callee = m.group(1)
        if not (on_generate_path(exc) or callee.split(".")[-1] in ("forward", "generate")):
            return None
        needs = [n for n in re.findall(r"'(\w+)'", m.group(2)) if _IDENT.match(n)]
        return _signature(f"{callee}({','.join(needs)})", f"`{callee}()` needs {', '.join(needs)}, which the made-up "
                          f"inputs lack ({at_where(where)})", frame, needs,
                          f"{callee} requires {', '.join(needs)}: inputs the model's own code builds")
    if exc.type == "ValueError" and (m := _NOT_IN_LIST.match(exc.message.strip())) and frame is not None:
        keys = [k for k in hints.get("config_keys") or [] if isinstance(k, str) and _IDENT.match(k)]
        token = m.group(1)
        named = f" (config {', '.join(keys)})" if keys else ""
        return _signature(f"token-{token}@{where}", f"the model looks for token {token}{named} in a prompt that "
                          f"has none ({at_where(where)})", frame, [],
                          f"the prompt must hold token {token}{named}, which the model's own input code inserts",
                          int(token))
    if exc.type == "PreprocessingFailed" and exc.message.startswith(REBUILD_FAILED):
        return Signature("generate-inputs", "generate-inputs:rebuild-failed", exc.message[:300], frame,
                         {"no_fix": "the run's inputs were rebuilt with the model's own code and still lack what the "
                                    "generate path needs: " + exc.message.removeprefix(REBUILD_FAILED)[:300]})
    made_up = hints.get("inputs_source") in ("synthesised", None)  # None: a record without the source
    if exc.type == "AssertionError" and frame is not None and on_generate_path(exc) and made_up:
        return _signature(f"assert@{where}",
                          f"the model's own input check fails {at_where(where)} on the made-up inputs",
                          frame, [], "the model's own input check rejects inputs npuport made up")
    return None


def _h26_generate_inputs(ctx: ModuleContext) -> None:
    """``prepare_inputs_for_generation`` with required parameters beyond the ids: generate needs inputs the
    model's own code builds (made-up token ids fail)."""
    for fn in ctx.ix.functions:
        if fn.name.value != "prepare_inputs_for_generation":
            continue
        params = [p for p in fn.params.params if p.default is None][1:]  # self
        needs = [p.name.value for p in params[1:]]  # beyond the ids
        if needs:
            ctx.add(HAZARD, "generate-needs-inputs", fn,
                    f"generate needs {', '.join(needs)} beside the ids (prepare_inputs_for_generation requires them): "
                    "the inputs come from the model's own input-building code, which npuport's runs use once a run "
                    "on made-up ids shows it (rebuild-inputs)", BLOCKS, LOW)


RULE = HazardRule(
    hazard=HAZARD,
    title="generate-path inputs the model's own code builds",
    detect=_h26_generate_inputs,
    manual={"generate-needs-inputs": "an inputs fix, not a code patch: the runs build these inputs with the model's "
                                     "own input-building code (the debugger's rebuild-inputs)"},
    explains=(ErrorPattern("generate-inputs", _generate_inputs, "inputs the model's own code builds",
                           needs_frame=False, order=25),),
    kb_topic=f"recipe:{HAZARD}",
    left_as_written="an inputs fix, not a code patch",
    fixtures=("tests/test_debugger_classes.py",),
)
