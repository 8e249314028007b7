"""Rewrites on the shapes real model code takes (issue 13, point 4), on small synthetic models of those
shapes: the scanner's findings, the codemods' rewrites and the report's resolution of each finding agree,
and a site a codemod leaves as written is reported as NOT changed, never as fixed."""

from __future__ import annotations

import textwrap

import pytest
import torch

from agents.reading.scanner import scan_source
from agents.report.bundle import finding_resolutions
from agents.rules.h6.moe import moe_dense_dispatch

# A routed-experts block of the expert-parallel class: training loop under `if self.training`, inference
# through a sorted-token function with host-synced counts and an offset expert index; a collective branch.
MOE_MODEL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.distributed as dist


    class Block(nn.Module):
        def __init__(self, n, d, k, world=1, rank=0):
            super().__init__()
            self.world, self.rank, self.share = world, rank, n // world
            self.k = k
            self.gate = nn.Linear(d, n)
            self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(n))

        def forward(self, h):
            w, ids = self.gate(h).softmax(-1).topk(self.k, dim=-1)
            if self.training:
                out = torch.zeros_like(h).repeat_interleave(self.k, 0)
                flat = ids.view(-1)
                for e, expert in enumerate(self.experts):
                    out[flat == e] = expert(h.repeat_interleave(self.k, 0)[flat == e])
                return (out.view(*w.shape, -1) * w.unsqueeze(-1)).sum(dim=1)
            return self.route(h, ids, w)

        @torch.no_grad()
        def route(self, h, expert_ids, expert_weight):
            counts = expert_ids.new_zeros((expert_ids.shape[0], len(self.experts)))
            counts.scatter_(1, expert_ids, 1)
            per_expert = counts.sum(dim=0)
            order = expert_ids.view(-1).argsort()
            tokens = h[order // expert_ids.shape[1]]
            if self.world > 1:
                dist.all_to_all_single(per_expert.clone(), per_expert)
            per_expert = per_expert.cpu().numpy()
            outs = []
            at = 0
            for i, n_tok in enumerate(per_expert):
                if n_tok == 0:
                    continue
                outs.append(self.experts[i + self.rank * self.share](tokens[at:at + n_tok]))
                at += n_tok
            y = torch.empty_like(tokens)
            y[order] = torch.cat(outs)
            return (y.view(*expert_ids.shape, -1).type(expert_weight.dtype).mul_(expert_weight.unsqueeze(dim=-1))
                    .sum(dim=1).type(y.dtype))

        def decide(self, h):
            if h.sum().item() != 0:
                return h
            return -h
''')


def _patch_from(result, file: str, finding_ids: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """The patch record apply_fix makes from a codemod result (agents/fixing/commits.py)."""
    return {"id": "patch-1", "commit": "0123456789ab", "codemod": "moe-dense-dispatch", "finding_ids": finding_ids,
            "edits": [f"{file} {e}" for e in result.edits],
            "sites": [f"{file}:{a}-{b}" for a, b in result.spans],
            "declined": [f"{file} {d}" for d in result.skipped]}


def test_moe_findings_are_fixed_only_where_the_rewrite_reached() -> None:
    findings = [f.model_dump(mode="json") for f in scan_source(MOE_MODEL, "block.py") if f.hazard == "H6"]
    by_rule: dict[str, list[dict]] = {}
    for f in findings:
        by_rule.setdefault(f["rule"], []).append(f)
    loops = sorted(by_rule["per-expert-loop"], key=lambda f: f["line"])
    assert [f["fixable"] for f in loops] == [False, True]  # the training loop: inference never takes it
    assert "inference never takes it" in loops[0]["message"]
    (numpy_sync,) = by_rule["numpy-sync"]
    assert numpy_sync["fixable"]
    (item,) = by_rule["item-sync"]
    assert not item["fixable"] and "control flow" in item["message"]

    result = moe_dense_dispatch(MOE_MODEL)
    assert result.changed and "guarded by" in result.edits[0]
    fixable = [f["id"] for f in findings if f["fixable"]]
    res = finding_resolutions(findings, [_patch_from(result, "block.py", fixable)], "validated")
    for f in findings:
        if f["fixable"]:
            assert res[f["id"]].startswith("fixed by patch-1"), res[f["id"]]
            assert "dense dispatch" in res[f["id"]]  # the report says what the rewrite did, and its cost bound
            assert "dense when experts <= R x top-k" in res[f["id"]]
            assert "otherwise the original host-synced loop runs" in res[f["id"]]
        else:
            assert res[f["id"]].startswith("left as written"), res[f["id"]]


def test_a_planned_rewrite_that_changed_nothing_is_reported_not_claimed() -> None:
    finding = {"id": "H6-x", "hazard": "H6", "rule": "elementwise-loop", "file": "m.py", "line": 40,
               "fixable": True}
    other = dict(finding, id="H6-y", line=10)
    patch = {"id": "patch-2", "commit": "abcdef012345", "codemod": "vectorise-mask-loops",
             "finding_ids": ["H6-x", "H6-y"], "edits": ["m.py line 9: element-wise fill loop -> masked_fill_"],
             "sites": ["m.py:9-12"], "declined": ["m.py line 40: a loop over a generator"]}
    res = finding_resolutions([finding, other], [patch], "validated")
    assert res["H6-y"].startswith("fixed by patch-2") and res["H6-y"].endswith("element-wise fill loop -> masked_fill_")
    assert res["H6-x"] == ("NOT changed: vectorise-mask-loops (patch-2) rewrote other sites but left this one as "
                           "written: a loop over a generator")
    # no patch at all (the codemod changed nothing in any file): still shown, not "left as written"
    res = finding_resolutions([finding], [], "validated")
    assert res["H6-x"].startswith("NOT changed: the planned codemod vectorise-mask-loops changed nothing here")
    # a patch that does not record its lines (an LLM edit) keeps the old meaning
    res = finding_resolutions([finding], [dict(patch, sites=[], edits=[])], "validated")
    assert res["H6-x"].startswith("fixed by patch-2")


NORMS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class ChannelsFirstNorm(nn.Module):
        def __init__(self, c, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(c))
            self.bias = nn.Parameter(torch.zeros(c))
            self.eps = eps

        def forward(self, x):
            mu = x.mean(1, keepdim=True)
            var = (x - mu).pow(2).mean(1, keepdim=True)
            x = (x - mu) / torch.sqrt(var + self.eps)
            return self.weight[:, None, None] * x + self.bias[:, None, None]


    class LastDimLayerNorm(nn.Module):
        def forward(self, x):
            centred = x - x.mean(-1, keepdim=True)
            return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)


    class Rms(nn.Module):
        def forward(self, x):
            variance = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(variance + 1e-6)


    class RmsOverChannels(nn.Module):
        def forward(self, x):
            return x / torch.sqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)
''')


def test_norms_are_classified_by_their_formula() -> None:
    found = {(f.rule, f.line): f for f in scan_source(NORMS, "norms.py") if f.hazard == "H4"}
    lines = NORMS.splitlines()

    def line_of(text: str) -> int:
        return next(i for i, s in enumerate(lines, 1) if text in s)

    layer2d = found[("layer-norm-formula", line_of("torch.sqrt(var + self.eps)"))]
    assert "channels-first" in layer2d.message and "NOT an RMSNorm" in layer2d.message and not layer2d.fixable
    assert ("layer-norm-formula", line_of("centred * torch.rsqrt")) in found
    rms = found[("rms-norm-opportunity", line_of("x * torch.rsqrt(variance"))]
    assert rms.fixable
    over_channels = found[("rms-norm-opportunity", line_of("x / torch.sqrt(x.pow(2).mean(1"))]
    assert not over_channels.fixable and "left as written" in over_channels.message
    assert sum(1 for rule, _ in found if rule == "rms-norm-opportunity") == 2
    res = finding_resolutions([layer2d.model_dump(mode="json")], [], "validated")
    assert res[layer2d.id].startswith("left as written")


def test_private_transformers_hooks_and_removed_cache_api_are_reported() -> None:
    src = textwrap.dedent('''
        import transformers
        from transformers.cache_utils import DynamicCache


        def make(base_cls):
            class Inner(base_cls):
                def _update_causal_mask(self, attention_mask, input_tensor, cache_position, past, output_attentions):
                    return None
            return Inner


        def step(past, n):
            past = DynamicCache.from_legacy_cache(past)
            used = past.get_usable_length(n)
            return used, past.seen_tokens, past.get_max_length(), past.to_legacy_cache()
    ''')
    found = [f for f in scan_source(src, "m.py") if f.hazard == "H8"]
    rules = sorted((f.rule, f.line) for f in found)
    # one finding per line (the scanner dedupes by hazard, rule and line)
    assert rules == [("deprecated-cache-api", 14), ("deprecated-cache-api", 15), ("deprecated-cache-api", 16),
                     ("private-api-override", 8)]
    assert "seen_tokens" in next(f.message for f in found if f.line == 16)
    override = next(f for f in found if f.rule == "private-api-override")
    assert "create_causal_mask" in override.message and "transformers_version" in override.message
    assert not any(f.fixable for f in found)
    # The same names in code that does not use transformers are not transformers' API.
    plain = src.replace("import transformers\nfrom transformers.cache_utils import DynamicCache\n",
                        "from mylib import DynamicCache\n")
    assert not [f for f in scan_source(plain, "m.py") if f.hazard == "H8"]


AUX = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class QueryEncoder(nn.Module):
        def __init__(self, d, n_q):
            super().__init__()
            self.queries = nn.Embedding(n_q, d)
            self.table = torch.zeros(4, dtype=torch.long)  # built once, not per step: left alone
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            x = x.flatten(2).transpose(1, 2)
            b, n, _ = x.shape
            q = self.queries.weight.unsqueeze(0).expand(b, -1, -1)
            kinds = torch.cat([torch.zeros(b, n, dtype=torch.long), torch.ones(b, q.shape[1], dtype=torch.long)], dim=1)
            pos = torch.arange(n + q.shape[1], device=x.device)
            return self.mix(torch.cat([x, q], dim=1), kinds, pos)

        def mix(self, h, kinds, pos):
            scale = torch.tensor(0.5)
            return self.proj(h) * (kinds[..., None] + 1) * scale + pos[None, :, None]
''')


@pytest.mark.meaning("aux-tensors-on-device")
def test_aux_tensors_made_on_the_cpu_in_forward_move_to_the_inputs_device() -> None:
    from agents.fixing.codemods import CODEMODS
    from agents.rules.h11_aux_device import aux_tensors_on_device

    found = {f.line: f for f in scan_source(AUX, "enc.py") if f.rule == "aux-tensor-device"}
    lines = AUX.splitlines()
    kinds_line = next(i for i, s in enumerate(lines, 1) if "kinds = torch.cat" in s)
    scale_line = next(i for i, s in enumerate(lines, 1) if "scale = torch.tensor" in s)
    assert sorted(found) == [kinds_line, scale_line]
    assert found[kinds_line].fixable and "device=x.device" in found[kinds_line].message
    # mix() never reads a parameter as a tensor (h only goes into a module): nothing to take the device from
    assert not found[scale_line].fixable and "left as written" in found[scale_line].message
    assert "aux-tensors-on-device" in CODEMODS

    result = aux_tensors_on_device(AUX, file="enc.py")
    assert result.changed and len(result.edits) == 2
    new = result.source
    assert "torch.zeros(b, n, dtype=torch.long, device=x.device)" in new
    assert "torch.ones(b, q.shape[1], dtype=torch.long, device=x.device)" in new
    assert "scale = torch.tensor(0.5)\n" in new
    assert "self.table = torch.zeros(4, dtype=torch.long)  #" in new  # __init__ is not the forward path
    assert new.count("device=x.device") == 3  # the arange that had a device keeps it, once
    # meaning: the same outputs on the CPU
    old_ns: dict = {}
    new_ns: dict = {}
    exec(compile(AUX, "<old>", "exec"), old_ns)
    exec(compile(new, "<new>", "exec"), new_ns)
    torch.manual_seed(0)
    a = old_ns["QueryEncoder"](8, 3)
    b = new_ns["QueryEncoder"](8, 3)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 8, 2, 3)
    assert torch.equal(a(x), b(x))


SCRIPT = textwrap.dedent('''
    import torch
    from transformers import AutoModelForCausalLM

    def run(path, ids):
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_2",
                                                     torch_dtype=torch.float32)
        with torch.no_grad():
            return model.eval()(ids).logits
''')


@pytest.mark.meaning("attn-impl-sdpa")
def test_flash_attention_selected_in_a_script_becomes_sdpa_and_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM, LlamaConfig

    from agents.rules.h4.attention import attn_impl_sdpa

    (finding,) = [f for f in scan_source(SCRIPT, "infer.py") if f.rule == "flash-attention-2-impl"]
    assert finding.fixable
    result = attn_impl_sdpa(SCRIPT)
    assert result.changed and 'attn_implementation="sdpa"' in result.source
    assert result.edits == [f"line {finding.line}: attn_implementation=\"flash_attention_2\" -> \"sdpa\" (flash-attn "
                            "needs CUDA; SDPA runs on Ascend and CPU)"]
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    old_ns: dict = {}
    new_ns: dict = {}
    exec(compile(SCRIPT, "<old>", "exec"), old_ns)
    exec(compile(result.source, "<new>", "exec"), new_ns)
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):  # what the user met: the script cannot load the model here
            old_ns["run"](str(tmp_path), ids)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", torch_dtype=torch.float32)
    with torch.no_grad():
        want = eager.eval()(ids).logits
    torch.testing.assert_close(new_ns["run"](str(tmp_path), ids), want, rtol=1e-4, atol=1e-5)
    # a table entry keyed by the name is not a selection: reported, not claimed
    (entry,) = [f for f in scan_source("TABLE = {'flash_attention_2': object, 'sdpa': object}\n", "m.py")
                if f.rule == "flash-attention-2-impl"]
    assert not entry.fixable


def test_scan_of_a_vllm_style_tree_reports_its_hazards_with_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An upstream vLLM path (out-of-tree model + run script), in small: `npuport scan` names each hazard's
    file:line, as the CLI prints it."""
    from agents.reading.scanner import scan_tree

    pkg = tmp_path / "serve_ocr"
    (pkg / "encoder").mkdir(parents=True)
    (pkg / "encoder" / "__init__.py").write_text("")
    (pkg / "encoder" / "mixer.py").write_text(textwrap.dedent('''
        import torch
        import transformers


        def make(base):
            class Inner(base):
                def _update_causal_mask(self, mask, x, pos, past, out):
                    return mask
            return Inner


        class Mixer(torch.nn.Module):
            def forward(self, x):
                kinds = torch.zeros(x.shape[0], x.shape[1], dtype=torch.long)
                return x, kinds
    ''').lstrip())
    (pkg / "model.py").write_text(textwrap.dedent('''
        import torch
        from vllm.model_executor.models.interfaces import SupportsMultiModal


        class OcrForCausalLM(torch.nn.Module, SupportsMultiModal):
            def forward(self, input_ids, pixel_values):
                if torch.sum(pixel_values).item() != 0:
                    return input_ids
                return input_ids
    ''').lstrip())
    (pkg / "run_image.py").write_text(textwrap.dedent('''
        import os
        os.environ['VLLM_USE_V1'] = '0'
        os.environ["CUDA_VISIBLE_DEVICES"] = '0'
        from vllm import LLM

        llm = LLM(model="x", enforce_eager=False, trust_remote_code=True, disable_mm_preprocessor_cache=True)
    ''').lstrip())
    result = scan_tree(tmp_path)
    where = {(f.rule, f"{f.file}:{f.line}") for f in result.findings}
    for expected in [("private-api-override", "serve_ocr/encoder/mixer.py:7"),
                     ("aux-tensor-device", "serve_ocr/encoder/mixer.py:14"),
                     ("framework-model-import", "serve_ocr/model.py:2"),
                     ("item-sync", "serve_ocr/model.py:7"),
                     ("vllm-v0-engine", "serve_ocr/run_image.py:2"),
                     ("cuda-graph-mode", "serve_ocr/run_image.py:6"),
                     ("vllm-renamed-option", "serve_ocr/run_image.py:6"),
                     ("trust-remote-code", "serve_ocr/run_image.py:6")]:
        assert expected in where, (expected, sorted(where))


def test_helpers_are_inserted_only_where_used_and_added_when_a_later_rewrite_needs_more() -> None:
    from agents.fixing.codemods import CODEMODS

    src = textwrap.dedent('''
        import torch


        def f(x):
            return x.cuda() * 2
    ''')
    first = CODEMODS["device-agnostic"][0](src)
    assert first.changed and "def _npuport_device(" in first.source
    assert "_NpuportCpuBackend" not in first.source and "_NpuportCpuStream" not in first.source
    assert len(first.source.splitlines()) - len(src.splitlines()) < 20
    # a second rewrite in the same file that needs the backend stand-ins gets them (and only them), once
    more = first.source + ("\n\ndef g():\n    torch.cuda.synchronize()\n"
                           "    return torch.cuda.Event(enable_timing=True)\n")
    second = CODEMODS["device-agnostic"][0](more)
    assert second.changed
    out = second.source
    assert out.count("def _npuport_device(") == 1 and out.count("import torch_npu") == 1
    assert "class _NpuportCpuBackend" in out and "class _NpuportCpuEvent" in out
    assert "def _npuport_api(" not in out  # never reached
    ns: dict = {}
    exec(compile(out, "<patched>", "exec"), ns)
    assert torch.equal(ns["f"](torch.ones(2)), torch.full((2,), 2.0))
    ns["g"]().record()


def test_sizes_fixed_in_code_are_reported_for_shrink() -> None:
    src = textwrap.dedent('''
        import torch.nn as nn


        def build_tower(layers=12, width=768, heads=12, kernel_size=3, checkpoint=None):
            return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


        class Model(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.tower = build_tower()
                self.queries = nn.Embedding(144, config.hidden_size)
                self.proj = nn.Linear(config.hidden_size, config.hidden_size)
                self.mixer = make_mixer(in_dim=896, out_dim=config.hidden_size)
                self.conv = nn.Conv2d(3, 8, kernel_size=3)
    ''')
    found = {f.line: f for f in scan_source(src, "m.py") if f.hazard == "H17"}
    assert sorted(found) == [5, 13, 15]
    assert "layers=12, width=768, heads=12" in found[5].message and "kernel_size" not in found[5].message
    assert "arg 1=144" in found[13].message and "in_dim=896" in found[15].message
    assert not any(f.fixable for f in found.values())


def test_a_mask_loop_the_codemod_declines_is_reported_with_its_reason() -> None:
    from agents.rules.h6.codemods import vectorise_mask_loops

    src = textwrap.dedent('''
        import torch


        def masks(kinds, scores):
            out = []
            for s in range(kinds.shape[0]):
                m = torch.full((kinds.shape[1], kinds.shape[1]), -1e4)
                pos = (kinds[s] == 1).nonzero(as_tuple=True)[0]
                for j, row in enumerate(pos):
                    m[row, pos[:j + 1]] = 0.0
                w = torch.zeros(kinds.shape[1], kinds.shape[1])
                for k, r in enumerate(pos):
                    w[r, pos] = scores[s, k]
                out.append(m + w)
            return torch.stack(out)
    ''')
    findings = [f.model_dump(mode="json") for f in scan_source(src, "m.py") if f.rule == "elementwise-loop"]
    assert sorted(f["line"] for f in findings) == [10, 13]
    result = vectorise_mask_loops(src)
    assert result.changed and len(result.edits) == 1 and result.edits[0].startswith("line 10:")
    assert len(result.skipped) == 1 and result.skipped[0].startswith("line 7-15: not a fill npuport can prove")
    patch = {"id": "patch-1", "commit": "0123456789ab", "codemod": "vectorise-mask-loops",
             "finding_ids": [f["id"] for f in findings], "edits": [f"m.py {e}" for e in result.edits],
             "sites": [f"m.py:{a}-{b}" for a, b in result.spans], "declined": [f"m.py {d}" for d in result.skipped]}
    res = finding_resolutions(findings, [patch], "validated")
    by_line = {f["line"]: res[f["id"]] for f in findings}
    assert by_line[10].startswith("fixed by patch-1") and "row-by-row fill" in by_line[10]
    assert by_line[13].startswith("NOT changed: vectorise-mask-loops (patch-1) rewrote other sites") and \
        "only constant values" in by_line[13]
    ns_old: dict = {}
    ns_new: dict = {}
    exec(compile(src, "<old>", "exec"), ns_old)
    exec(compile(result.source, "<new>", "exec"), ns_new)
    kinds = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]])
    scores = torch.arange(10.0).view(2, 5)
    assert torch.equal(ns_new["masks"](kinds, scores), ns_old["masks"](kinds, scores))


def test_patch_sites_are_counted_in_the_original_file_after_earlier_patches_moved_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two codemods on one file, one commit each, as the patcher runs them: the first inserts helpers at the
    top, so the second rewrites lines that have moved; its patch still names the original lines, and the
    report resolves the findings (which point at the original) as fixed."""
    from agents.fixing.commits import apply_fix
    from agents.models import FixAction
    from agents.workspace import Workspace

    model = tmp_path / "model"
    model.mkdir()
    (model / "enc.py").write_text(AUX.replace("    def mix(self, h, kinds, pos):",
                                              "    def mix(self, h, kinds, pos):\n        h = h.cuda()"))
    ws = Workspace.create(model, tmp_path / "ws")
    findings = [f.model_dump(mode="json") for f in scan_source((model / "enc.py").read_text(), "enc.py")
                if f.fixable and (f.rule == "aux-tensor-device" or f.hazard == "H1")]
    aux = [f for f in findings if f["rule"] == "aux-tensor-device"]
    assert len(aux) == 1 and len(findings) == 2
    cuda = [f for f in findings if f["rule"] != "aux-tensor-device"]
    p1, _ = apply_fix(ws, FixAction(codemod="device-agnostic", files=["enc.py"], finding_ids=[cuda[0]["id"]],
                                    summary="device"), 1)
    p2, _ = apply_fix(ws, FixAction(codemod="aux-tensors-on-device", files=["enc.py"], finding_ids=[aux[0]["id"]],
                                    summary="aux"), 2)
    assert p1 is not None and p2 is not None
    patched = (ws.model_dir / "enc.py").read_text()
    moved = next(i for i, s in enumerate(patched.splitlines(), 1) if "kinds = torch.cat" in s)
    assert moved > aux[0]["line"]  # the helpers moved it down
    # (the .cuda() fix made mix()'s h a tensor it can read, so torch.tensor(0.5) there gets a device too)
    line = aux[0]["line"]
    assert p2.sites[:2] == [f"enc.py:{line}-{line}"] * 2
    assert all(e.startswith(f"enc.py line {line}: ") for e in p2.edits[:2])
    res = finding_resolutions(findings, [p1.model_dump(mode="json"), p2.model_dump(mode="json")], "validated")
    assert all(r.startswith("fixed by") for r in res.values()), res
