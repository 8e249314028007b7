"""H18: version couplings, code that works only with the transformers release its authors ran. A release
written for transformers 4.x imports names that all still exist in 5.x and then breaks at run time: a
``PreTrainedModel`` subclass relies on inheriting ``generate``; config attributes moved to the generation
config; removed helpers (``get_head_mask``); ``_supports_sdpa`` written as a property; an old
``_tied_weights_keys`` list; ``rope_scaling["type"]``; names that an old star import leaked.

The fix is not a patch but the environment of the model's era (agents/environment/resolve.py runs the original
and the port with the transformers of config.json's ``transformers_version``, or the last 4.x that gives
PreTrainedModel generate (4.49) when the config names none and this scan finds couplings). One hazard class, one module
(see docs/rules.md).

``couplings(source)`` is plain ``ast`` so the environment resolver asks it without a CST parse."""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

from agents.rules.base import BLOCKS, HIGH, HazardRule
from agents.rules.context import ModuleContext

NEEDS = "needs transformers < 5"
# PretrainedConfig attributes transformers 5 keeps on the GenerationConfig only.
GENERATION_ATTRS = frozenset({
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "temperature",
    "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "diversity_penalty", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "tie_encoder_decoder",
})
REMOVED_HELPERS = {"get_head_mask": "PreTrainedModel.get_head_mask was removed in transformers 5",
                   "_convert_head_mask_to_5d": "PreTrainedModel._convert_head_mask_to_5d was removed in transformers 5"}
PROPERTY_FLAGS = ("_supports_sdpa", "_supports_flash_attn_2", "_supports_flex_attn", "_supports_cache_class")
LEAKED = frozenset({"List", "Dict", "Tuple", "Optional", "Union", "Callable", "Any", "Sequence", "Iterable"})


@dataclass(frozen=True)
class Coupling:
    rule: str
    line: int
    col: int
    reason: str
    before: str = "5"  # the first transformers release the code breaks with ("4.45": needs transformers < 4.45)


# transformers 4.45 made generate() build the model config without arguments (``config.__class__()``, in
# ``_get_non_default_generation_parameters``), catching only ValueError.
COMPOSITE_BEFORE = "4.45"


def _composite_without_defaults(tree: ast.Module) -> list[Coupling]:
    """Config classes that declare themselves composite (``is_composition = True``: built only from their
    sub-configs) and whose __init__ refuses to run without them other than with a ValueError (an assert,
    another error raised, ``kwargs.pop("encoder")`` / ``kwargs["encoder"]`` with no default)."""
    out = []
    for c in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        composite = any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "is_composition"
                                                          for t in s.targets)
                        and isinstance(s.value, ast.Constant) and s.value.value is True for s in c.body)
        init = next((f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if not composite or init is None:
            continue
        kwarg = init.args.kwarg.arg if init.args.kwarg else None
        refuses = None
        for n in sorted(ast.walk(init), key=lambda x: (getattr(x, "lineno", 0), getattr(x, "col_offset", 0))):
            if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name) \
                    and n.exc.func.id == "ValueError":
                break  # the first refusal is the ValueError transformers catches
            if isinstance(n, ast.Assert):
                refuses = "an assert"
            elif isinstance(n, ast.Raise) and n.exc is not None:
                refuses = "a raise other than ValueError"
            elif kwarg and isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pop" \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == kwarg and len(n.args) == 1:
                refuses = f"`{kwarg}.pop(...)` with no default (KeyError)"
            if refuses:
                break
        if refuses:
            out.append(Coupling("composite-config-init", c.lineno, c.col_offset,
                                f"needs transformers < {COMPOSITE_BEFORE}: `{c.name}` is a composite config "
                                f"(is_composition) whose __init__ cannot run without its sub-configs ({refuses}); "
                                f"transformers {COMPOSITE_BEFORE}+ generate builds `config.__class__()` with no "
                                "arguments and catches only ValueError", before=COMPOSITE_BEFORE))
    return out


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [b.attr if isinstance(b, ast.Attribute) else b.id if isinstance(b, ast.Name) else "" for b in cls.bases]


# transformers 4.54 gives every model an empty DynamicCache at generate's first step (before, a model that did
# not declare ``_supports_cache_class`` got None there and its own legacy tuples after).
LEGACY_CACHE_BEFORE = "4.54"
_PAST_NAMES = ("past_key_values", "past_key_value", "past", "layer_past")


def _legacy_cache_default(tree: ast.Module) -> list[Coupling]:
    """A module that reads the cache as legacy tuples (``past_key_values[0][0]``) and declares no cache
    class support (``_supports_cache_class = True``): from 4.54 the first step's cache is an empty
    DynamicCache, not None, and the tuple read fails (``'NoneType' object has no attribute 'size'``)."""
    declares = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in (
        "_supports_cache_class", "_supports_default_dynamic_cache") for t in n.targets) for n in ast.walk(tree))
    if declares:
        return []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, int) \
                and isinstance(n.value, ast.Subscript) and isinstance(n.value.slice, ast.Constant) \
                and isinstance(n.value.value, ast.Name) and n.value.value.id in _PAST_NAMES:
            return [Coupling("legacy-cache-default", n.lineno, n.col_offset,
                             f"needs transformers < {LEGACY_CACHE_BEFORE}: reads the cache as legacy tuples "
                             f"(`{n.value.value.id}[..][..]`) and declares no `_supports_cache_class`; from "
                             f"{LEGACY_CACHE_BEFORE} generate passes an empty DynamicCache at the first step, not None",
                             before=LEGACY_CACHE_BEFORE)]
    return []


def _generative_without_mixin(tree: ast.Module) -> list[Coupling]:
    """Classes deriving (in this file) from a PreTrainedModel that use generation (they define
    ``prepare_inputs_for_generation``) with GenerationMixin nowhere among their bases."""
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}

    def lineage(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        c = classes.get(name)
        if c is None or name in seen:
            return {name}
        return {name}.union(*(lineage(b, seen | {name}) for b in _base_names(c)))

    out = []
    for c in classes.values():
        bases = lineage(c.name)
        if not any(b.endswith("PreTrainedModel") for b in bases) or "GenerationMixin" in bases:
            continue
        if any(isinstance(f, ast.FunctionDef) and f.name == "prepare_inputs_for_generation" for f in c.body):
            out.append(Coupling("inherits-generate", c.lineno, c.col_offset,
                                f"{NEEDS}: `{c.name}` inherits generate from PreTrainedModel without GenerationMixin "
                                "(transformers 5 gives generate only to GenerationMixin subclasses)"))
    return out


def _assigned_self_attrs(tree: ast.Module) -> set[str]:
    return {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def _bound_names(tree: ast.Module) -> set[str]:
    names: set[str] = set(dir(builtins))
    for n in ast.walk(tree):
        if isinstance(n, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
    return names


def couplings(source: str, config_attrs: frozenset[str] = frozenset()) -> list[Coupling]:
    """The version couplings in one module. ``config_attrs``: attributes the model's config classes set
    themselves (in any file), which are no coupling when read."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = _generative_without_mixin(tree) + _composite_without_defaults(tree) + _legacy_cache_default(tree)
    own = _assigned_self_attrs(tree) | config_attrs
    star = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    bound = _bound_names(tree) if star else set()
    leaked_seen: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            holder = (n.value.attr if isinstance(n.value, ast.Attribute)
                      else n.value.id if isinstance(n.value, ast.Name) else "")
            if holder == "config" and n.attr in GENERATION_ATTRS and n.attr not in own:
                out.append(Coupling("generation-config-attr", n.lineno, n.col_offset,
                                    f"{NEEDS}: reads `config.{n.attr}`, which transformers 5 keeps on the generation "
                                    "config only (the model config no longer has it)"))
            elif n.attr in REMOVED_HELPERS and holder == "self":
                out.append(Coupling("removed-helper", n.lineno, n.col_offset, f"{NEEDS}: calls `self.{n.attr}`; "
                                    f"{REMOVED_HELPERS[n.attr]}"))
        elif isinstance(n, ast.FunctionDef) and n.name in PROPERTY_FLAGS and any(
                isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list):
            out.append(Coupling("flag-property", n.lineno, n.col_offset,
                                f"{NEEDS}: `{n.name}` is a property; transformers 5 sets it on the instance in "
                                "PreTrainedModel.__init__, which fails on a property without a setter"))
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_tied_weights_keys"
                                               for t in n.targets) and isinstance(n.value, ast.List | ast.Tuple):
            out.append(Coupling("tied-weights-list", n.lineno, n.col_offset,
                                f"{NEEDS}: `_tied_weights_keys` is a list; transformers 5 reads a mapping "
                                "{target: source} in post_init"))
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "type" and (
                (isinstance(n.value, ast.Attribute) and n.value.attr == "rope_scaling")
                or (isinstance(n.value, ast.Name) and n.value.id == "rope_scaling")):
            out.append(Coupling("rope-scaling-type", n.lineno, n.col_offset,
                                f"{NEEDS}: reads `rope_scaling[\"type\"]`; transformers 5 normalises rope_scaling "
                                "to `rope_type` (KeyError: 'type')"))
        elif star and isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in LEAKED and \
                n.id not in bound and n.id not in leaked_seen:
            leaked_seen.add(n.id)
            mods = ", ".join(sorted({s.module or "." for s in star}))
            out.append(Coupling("star-import-leak", n.lineno, n.col_offset,
                                f"uses `{n.id}` without importing it: an old release of a star import ({mods}) "
                                "leaked the name; a newer one does not (NameError)"))
    return sorted(out, key=lambda c: (c.line, c.col))


def config_class_attrs(sources: list[str]) -> frozenset[str]:
    """Attributes set on self by the model's config classes (PretrainedConfig subclasses), in any file."""
    attrs: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for c in ast.walk(tree):
            if isinstance(c, ast.ClassDef) and any(b.endswith("Config") for b in _base_names(c)):
                attrs |= _assigned_self_attrs(ast.Module(body=c.body, type_ignores=[]))
    return frozenset(attrs)


def _h18_version_couplings(ctx: ModuleContext) -> None:
    for c in couplings(ctx.source):
        snippet = ctx.lines[c.line - 1].strip() if 0 < c.line <= len(ctx.lines) else ""
        ctx.findings.append(ctx.registry.finding("H18", c.rule, ctx.path, c.line, c.col, snippet, c.reason,
                                                 BLOCKS, HIGH, fixable=False))


_ERA = ("not patched: the original and the port run in the environment of the model's era (config.json's "
        "transformers_version; the last 4.x whose PreTrainedModel inherits generate, 4.49, when it names none), where "
        "this code works as written")

RULE = HazardRule(
    hazard="H18",
    title="Version couplings: code that needs the transformers release its authors ran",
    detect=_h18_version_couplings,
    manual={rule: _ERA for rule in ("inherits-generate", "generation-config-attr", "removed-helper", "flag-property",
                                    "tied-weights-list", "rope-scaling-type", "star-import-leak",
                                    "composite-config-init", "legacy-cache-default")},
    kb_topic="recipe:H18",
    left_as_written="the environment of the model's era runs it as written (agents/environment/resolve.py)",
    fixtures=("tests/test_version_couplings.py",),
)
