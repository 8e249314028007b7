"""Op-support matrix: yaml version rules, symbol parsing, wheel access, and the real 2.13.0 build.

The real-wheel tests download torch-npu 2.13.0 once into NPUPORT_WHEEL_CACHE (default
~/.cache/npuport-tests/wheels) and skip only when the package registry cannot be reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from knowledge import matrix_yaml as my
from knowledge import wheel as wh
from knowledge.matrix_compare import compare_wheel_yaml, format_summary
from knowledge.matrix_docs import docs_by_aten_name, parse_docs_dir
from knowledge.matrix_symbols import OpName, resolve, scan_library, split_key, wrapper_table
from knowledge.op_matrix import (
    OpMatrix,
    build_matrix,
    load_matrix,
    load_or_build,
    op_key,
)

FIXTURE = Path(__file__).parent / "fixtures" / "matrix_disagreements_2.13.0.json"
VERSION = "2.13.0"
ALL = [(2, v) for v in range(1, 14)]  # v2.1 .. v2.13


# --- yaml version fields ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "expect"),
    [
        ("all_version", set(ALL)),
        ("v2.1", {(2, 1)}),
        ("v2.1, v2.2, v2.13", {(2, 1), (2, 2), (2, 13)}),
        (["v2.6", "newest"], {(2, v) for v in range(6, 14)}),
        (["v2.1", "v2.12"], {(2, v) for v in range(1, 13)}),
        ([" v2.10", "newest "], {(2, 10), (2, 11), (2, 12), (2, 13)}),
        ("[v2.7, newest]", {(2, v) for v in range(7, 14)}),
        (None, set()),
    ],
)
def test_versions_of(field: Any, expect: set[tuple[int, int]]) -> None:
    assert my.versions_of(field, ALL) == expect


def test_versions_of_rejects_malformed() -> None:
    with pytest.raises(my.YamlError):
        my.versions_of(["v2.1", "v2.2", "v2.3"], ALL)  # a range has two ends
    with pytest.raises(my.YamlError):
        my.versions_of("twenty", ALL)


def test_parse_version_forms() -> None:
    assert my.parse_version("v2.13") == (2, 13)
    assert my.parse_version("2.10.0.post4") == (2, 10)


SNIPPET = """
all_version: [v2.1, v2.2, v2.3]
official:
  - func: abs.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
    op_api: [v2.2, newest]
    gen_opapi:
      exec: aclnnAbs, self, out
  - func: abs(Tensor self) -> Tensor
    acl_op: all_version
    op_api: [v2.2, newest]
    gen_opapi:
      structured_inherit: abs.out
  - func: old_only(Tensor self) -> Tensor
    acl_op: v2.1
  - func: std.correction(Tensor self, int[1]? dim, *, int? correction, bool keepdim=False) -> Tensor
    acl_op: v2.1
  - func: std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
    acl_op: [v2.2, newest]
custom:
  - func: npu_thing(Tensor self) -> Tensor
    op_api: v2.1, v2.3
symint:
  - func: zeros(SymInt[] size, *, ScalarType? dtype=None) -> Tensor
    acl_op: [v2.1, newest]
"""


def test_ops_for_version_on_snippet(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text(SNIPPET)
    data = my.load_yaml(p)
    v3 = {o.key: o for o in my.ops_for_version(data, "2.3")}
    assert set(v3) == {"abs.out", "abs", "std.correction", "npu_thing", "zeros"}
    assert v3["abs.out"].is_out and v3["abs.out"].kernel == "op_api" and v3["abs.out"].exec == "aclnnAbs"
    assert v3["abs"].kernel == "both" and v3["abs"].exec == "aclnnAbs"  # via structured_inherit
    assert not v3["abs"].is_out
    assert v3["npu_thing"].section == "custom" and v3["zeros"].section == "symint"
    v1 = {o.key for o in my.ops_for_version(data, "2.1.0")}
    assert v1 == {"abs", "old_only", "std.correction", "npu_thing", "zeros"}
    assert {o.key for o in my.ops_for_version(data, "2.4")} == set()  # beyond the file's versions


def test_load_yaml_rejects_other_files(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("a: 1\n")
    with pytest.raises(my.YamlError, match="all_version"):
        my.load_yaml(p)


# --- symbols ---------------------------------------------------------------------------------

OPS = [
    OpName("add", "Tensor", False),
    OpName("add", "out", True),
    OpName("add_", "Tensor", False),
    OpName("_add_relu", "Tensor", False),
    OpName("_add_relu", "out", True),
    OpName("masked_scatter_", "", False),
    OpName("max", "dim_max", True),
]


@pytest.mark.parametrize(
    ("ident", "key", "dkey"),
    [
        ("wrapper_NPU_Tensor_add", "add.Tensor", "NPU"),
        ("wrapper_NPU_Tensor_add_", "add_.Tensor", "NPU"),
        ("wrapper_NPU_out_add_out", "add.out", "NPU"),
        ("wrapper_NPU_Tensor__add_relu", "_add_relu.Tensor", "NPU"),
        ("wrapper_NPU_out__add_relu_out", "_add_relu.out", "NPU"),
        ("wrapper_NPU__masked_scatter_", "masked_scatter_", "NPU"),
        ("wrapper_AutogradNPU_dim_max_max_out", "max.dim_max", "AutogradNPU"),
        ("wrapper__masked_scatter_", "masked_scatter_", ""),
    ],
)
def test_resolve_wrapper_names(ident: str, key: str, dkey: str) -> None:
    w = split_key(ident)
    assert w.dispatch_key == dkey
    assert resolve(w.rest, wrapper_table(OPS), {o.name for o in OPS})[0] == key


def test_resolve_unknown_overload_and_unresolved() -> None:
    names = {o.name for o in OPS}
    assert resolve("Scalar_add", wrapper_table(OPS), names) == ("add.Scalar", "split")
    assert resolve("weird_thing_out_out", wrapper_table(OPS), names) == (None, "unresolved")


def _fake_lib(pad: int) -> bytes:
    """Bytes laid out like the real library: mangled names inside C strings, NUL-separated."""
    parts = [
        b"\x00" * pad,
        b"ZNS4_12_GLOBAL__N_112_GLOBAL__N_122wrapper_NPU_Tensor_addES7_S7_SA_EEEES5_NS_4guts\x00",
        b"\x7f" * pad,
        b"XadL_ZNS4_12_GLOBAL__N_128wrapper_NPU__masked_scatter_ES6_S8_S8_EEEES6\x00",
        b"XadL_ZN9op_plugin8int_reprES7_EEEES5_\x00",
        b"\x00Warning: kernel [isneginf] is not supported by NPU currently. Now this kernel is running on CPU.\x00",
        b"\x01" * pad,
        b"\x00CAUTION: The operator 'aten::_fused_adam_' is not currently supported on the NPU backend "
        b"and will fall back to run on the CPU. This may have performance implications.\x00",
        b"junk 99wrapper_NPU_short\x00",  # length prefix longer than the name: ignored
    ]
    return b"".join(parts)


def _fake_wheel(path: Path, lib: bytes, extra: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(wh.LIB_MEMBER, lib)
        z.writestr(wh.VERSION_MEMBER, "__version__ = '2.13.0'\n")
        for k, v in (extra or {}).items():
            z.writestr(k, v)
    return path


@pytest.mark.parametrize("chunk", [1 << 20, 97, 4099])
def test_scan_library_streams_across_chunk_edges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    # Tiny chunks put symbols and sentences across buffer edges; results must not change.
    monkeypatch.setattr(wh, "_CHUNK", chunk)
    monkeypatch.setattr(wh, "_OVERLAP", 1024)
    monkeypatch.setattr(wh, "_SKIP", 300)
    r = wh.open_wheel(_fake_wheel(tmp_path / "t.whl", _fake_lib(pad=5000)))
    scan = scan_library(r)
    assert scan.wrappers == {"wrapper_NPU_Tensor_add", "wrapper_NPU__masked_scatter_"}
    assert scan.direct == {"int_repr"}
    assert set(scan.fallback_messages) == {"isneginf", "_fused_adam_"}
    assert scan.fallback_messages["_fused_adam_"].startswith("CAUTION: The operator 'aten::_fused_adam_'")
    assert wh.wheel_version(r) == "2.13.0"


# --- wheel access ----------------------------------------------------------------------------


def test_corrupt_or_foreign_files_give_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    bad.write_bytes(b"this is not a zip archive")
    with pytest.raises(wh.WheelError, match="not a wheel"):
        wh.open_wheel(bad)
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("pkg/__init__.py", "")
    with pytest.raises(wh.WheelError, match="not a torch_npu wheel"):
        wh.open_wheel(other)
    with pytest.raises(wh.WheelError, match="no such wheel"):
        wh.open_wheel(tmp_path / "missing.whl")
    with pytest.raises(wh.WheelError, match="not a wheel"):
        build_matrix(VERSION, wheel=bad)


def test_installed_distribution_found_without_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "torch_npu" / "lib").mkdir(parents=True)
    (site / "torch_npu" / "lib" / "libtorch_npu.so").write_bytes(_fake_lib(pad=10))
    # An __init__ that fails on import, as torch_npu does without CANN: we must never import it.
    (site / "torch_npu" / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open')\n")
    info = site / "torch_npu-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (info / "RECORD").write_text("torch_npu/__init__.py,,\ntorch_npu/lib/libtorch_npu.so,,\n")
    monkeypatch.syspath_prepend(str(site))
    inst = wh.installed_torch_npu("2.13.0")
    assert inst is not None and inst.root == site
    assert wh.installed_torch_npu("2.12.0") is None
    assert scan_library(inst).wrappers == {"wrapper_NPU_Tensor_add", "wrapper_NPU__masked_scatter_"}


def _fake_pip(rc: int, out: str) -> Any:
    # pip talks to the package registry, which is outside our walls: fake its answer.
    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert (
            "--only-binary=:all:" in cmd
            and "--no-deps" in cmd
            and any(c.startswith("torch-npu==") for c in cmd)
        )
        return subprocess.CompletedProcess(cmd, rc, stdout="", stderr=out)

    return run


def test_download_errors_say_whether_the_registry_was_reachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        wh.subprocess, "run", _fake_pip(1, "Failed to establish a new connection: [Errno 101]")
    )
    with pytest.raises(wh.WheelDownloadError) as e:
        wh.download_wheel("2.13.0", tmp_path)
    assert e.value.unreachable and "could not be reached" in str(e.value)
    monkeypatch.setattr(wh.subprocess, "run", _fake_pip(1, "ERROR: Could not find a version that satisfies"))
    with pytest.raises(wh.WheelDownloadError) as e:
        wh.download_wheel("9.9.9", tmp_path)
    assert not e.value.unreachable and wh.machine_arch() in str(e.value)


def test_wheel_cache_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_WHEEL_CACHE", str(tmp_path / "wc"))
    assert wh.wheel_cache_dir() == tmp_path / "wc"
    w = _fake_wheel(
        tmp_path / "wc" / f"torch_npu-2.13.0-cp311-cp311-manylinux_2_28_{wh.machine_arch()}.whl", b"x"
    )
    assert wh.cached_wheel("2.13.0") == w
    assert wh.cached_wheel("2.12.0") is None


# --- docs ------------------------------------------------------------------------------------


def test_docs_tables_and_dtype_notes(tmp_path: Path) -> None:
    (tmp_path / "torch.md").write_text(
        "### torch.widget\n\n| 硬件 | 是否支持 |\n| ---- | :----: |\n| <term>Chip A</term> | ✔ |\n"
        "| <term>Chip B</term> | ✘ |\n\n**限制与说明**： `input`仅支持bf16，fp16，fp32\n\n"
        "### torch.gadget\n\n| <term>Chip A</term> | ✔ |\n\n**限制与说明**： `input`仅支持fp16，weird8\n"
    )
    docs = parse_docs_dir(tmp_path)
    assert docs["torch.widget"].products == {"Chip A": True, "Chip B": False}
    assert docs["torch.widget"].dtypes == ["bfloat16", "float16", "float32"]
    assert docs["torch.gadget"].dtypes is None  # an unknown token: keep nothing rather than guess
    assert set(docs_by_aten_name(docs, {"widget"})) == {"widget"}


# --- a matrix from a small synthetic wheel (no network) ---------------------------------------


def test_build_from_synthetic_wheel_and_yaml(tmp_path: Path, npuport_home: Path) -> None:
    y = tmp_path / "f.yaml"
    y.write_text(
        "all_version: [v2.12, v2.13]\nofficial:\n"
        "  - func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor\n"
        "    acl_op: all_version\n    op_api: all_version\n"
        "  - func: mm(Tensor self, Tensor mat2) -> Tensor\n    op_api: [v2.13, newest]\n"
        "custom:\n  - func: npu_thing(Tensor self) -> Tensor\n    op_api: all_version\n"
    )
    docs_py = '_add_torch_npu_docstr(\n    "npu_rms_norm",\n    """doc"""\n)\n'
    w = _fake_wheel(tmp_path / "t.whl", _fake_lib(pad=100), {wh.DOCS_MEMBER: docs_py})
    m = build_matrix(VERSION, wheel=w, yaml_paths=[y])
    assert m.has_npu_kernel("aten::add.Tensor") and m.ops["add.Tensor"]["via"] == ["wheel", "yaml"]
    assert m.ops["add.Tensor"]["kernel"] == "both"
    assert m.has_npu_kernel("masked_scatter_") and m.ops["masked_scatter_"]["via"] == ["wheel"]
    assert not m.ops["mm"]["npu"] and m.ops["mm"]["yaml_kernel"] == "op_api"  # the wheel decides
    assert m.is_fallback("isneginf") and not m.has_npu_kernel("isneginf")
    assert m.has_npu_kernel("linear") and m.ops["linear"]["composite"] == "implicit"
    assert {"npu_rms_norm", "npu_thing"} <= set(m.custom_ops)
    cmp = compare_wheel_yaml(m)
    assert {(d["op"], d["reason"]) for d in cmp["disagreements"]} == {("mm", "yaml_only")}
    # yaml alone decides when there is no wheel
    y_only = build_matrix(VERSION, yaml_paths=[y], use_wheel=False)
    assert y_only.has_npu_kernel("mm") and y_only.ops["mm"]["via"] == ["yaml"]


def test_op_key_forms() -> None:
    assert op_key("aten::add.Tensor") == "add.Tensor"
    assert op_key("aten::mm.default") == "mm"
    assert op_key("mm") == "mm"


# --- the real torch_npu 2.13.0 wheel ----------------------------------------------------------


@pytest.fixture(scope="session")
def real_wheel() -> Path:
    cache = Path(os.environ.get("NPUPORT_WHEEL_CACHE") or Path.home() / ".cache" / "npuport-tests" / "wheels")
    cache.mkdir(parents=True, exist_ok=True)
    got = wh.cached_wheel(VERSION, cache)
    if got is not None:
        return got
    try:
        return wh.download_wheel(VERSION, cache)
    except wh.WheelDownloadError as e:
        if e.unreachable:
            pytest.skip(f"package registry unreachable, cannot download torch-npu {VERSION}: {e}")
        raise


@pytest.fixture(scope="session")
def real_matrix(real_wheel: Path, shared_data: Path) -> OpMatrix:
    return build_matrix(
        VERSION,
        wheel=real_wheel,
        yaml_paths=[shared_data / "op-plugin" / "op_plugin_functions.master.yaml"],
        docs_dir=shared_data / "ascend-pytorch-docs" / "native_api_2-13-0",
    )


def test_real_matrix_agrees_with_op_plugin_yaml(real_matrix: OpMatrix) -> None:
    cmp = compare_wheel_yaml(real_matrix)
    assert cmp["compared"] > 900  # the bulk of aten ops, not a handful
    assert cmp["agreement"] >= 0.95
    want = json.loads(FIXTURE.read_text())
    got = {(d["op"], d["side"], d["reason"]) for d in cmp["disagreements"]}
    assert got == {(d["op"], d["side"], d["reason"]) for d in want["disagreements"]}
    got_out = {(d["op"], d["reason"]) for d in cmp["outside_yaml"]}
    assert got_out == {(d["op"], d["reason"]) for d in want["outside_yaml"]}
    assert set(real_matrix.unresolved_wrappers) == set(want["unresolved_wrappers"])
    assert cmp["agreement_all"] >= 0.9


def test_real_matrix_ops(real_matrix: OpMatrix) -> None:
    m = real_matrix
    for op in ("aten::add.Tensor", "mm", "masked_scatter_", "add.out", "aten::view"):
        assert m.has_own_kernel(op), op
    # isneginf: the wheel's own warning says its kernel runs on the CPU
    assert not m.has_npu_kernel("aten::isneginf") and m.is_fallback("aten::isneginf")
    assert "isneginf" in m.fallback_ops
    assert "is not supported by NPU currently" in m.fallback_messages["isneginf"]
    # composite: linear decomposes (CompositeImplicitAutograd); transpose is an explicit view
    assert m.has_npu_kernel("linear") and not m.has_own_kernel("linear")
    assert m.ops["linear"]["composite"] == "implicit"
    assert m.ops["transpose.int"]["composite"] == "explicit" and m.ops["transpose.int"]["view"]
    # an op nobody implements and torch does not decompose is absent
    assert not m.has_npu_kernel("aten::_nested_tensor_from_mask")
    assert m.dtypes("mm") == ["float16", "float32"]  # from the docs' limits note
    assert m.ops["abs"]["exec"] == "aclnnAbs"
    assert {"npu_rms_norm", "npu_fusion_attention", "npu_rotary_mul"} <= set(m.custom_ops)
    assert m.is_custom("torch_npu.npu_rms_norm")
    assert not m.unresolved_wrappers or len(m.unresolved_wrappers) < 5


def test_real_matrix_roundtrip_and_summary(
    real_matrix: OpMatrix, npuport_home: Path, real_wheel: Path
) -> None:
    path = real_matrix.save()
    assert path == npuport_home / "matrices" / f"torch_npu-{VERSION}.json"
    raw = json.loads(path.read_text())
    assert raw["schema"] == 1 and raw["torch_npu_version"] == VERSION and raw["torch_version"] == "2.13"
    assert {s["kind"] for s in raw["sources"]} == {"wheel", "yaml", "docs"}
    assert set(raw["ops"]["add.Tensor"]) >= {"npu", "via", "kernel", "exec", "dtypes"}
    back = load_matrix(path)
    assert back.ops == real_matrix.ops and back.fallback_ops == real_matrix.fallback_ops
    assert load_or_build(VERSION).ops == real_matrix.ops  # served from the stored file
    s = real_matrix.summary()
    assert s["npu_ops"] > 2000 and s["own_kernels"] > 1000 and s["agreement"]["agreement"] >= 0.95
    text = format_summary(real_matrix)
    assert "torch_npu 2.13.0" in text and "wheel vs yaml" in text and len(text.splitlines()) <= 6
    assert real_matrix.build["timings"]["wheel_scan_s"] < 30


def test_corrupt_stored_matrix(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text("{not json")
    with pytest.raises(Exception, match="cannot read op matrix"):
        load_matrix(p)
    p.write_text(json.dumps({"schema": 99}))
    with pytest.raises(Exception, match="schema"):
        load_matrix(p)
