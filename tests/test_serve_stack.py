"""The serving stack is one tuple from a vllm-ascend release row, and known-bad releases (from the knowledge
base, else npuport's packaged note, said so) steer the choice."""

from __future__ import annotations

from dataclasses import dataclass

from agents.deploy import stack
from agents.environment.compat import load_compat


@dataclass
class _Hit:
    text: str
    source: str = "user-notes/stacks.md"
    path: str = ""


def test_the_tuple_comes_from_one_release_row_and_skips_the_known_bad() -> None:
    compat = load_compat()
    got = stack.choose_stack(compat, None, "2.13.0")
    chosen = got["chosen"]
    row = compat["vllm_ascend"][chosen["vllm_ascend"]]
    assert chosen["vllm_ascend"] == "0.23.0" and not chosen["vllm_ascend"].count("rc")  # a final release first
    assert (chosen["vllm"], chosen["torch"], chosen["torch_npu"], chosen["cann"]) == \
        (row["vllm"], row["torch"], row["torch_npu"], row["cann"])
    assert chosen["transformers"] == "5.5.4"
    assert [s["vllm_ascend"] for s in got["skipped"]] == ["0.22.1rc1"]
    assert "attention_type" in got["skipped"][0]["reason"]
    assert "not built" in got["known_bad_from"]  # no KB: the packaged note, and the report says so
    assert not got["op_inventory_matches"] and "--torch-npu 2.10.0.post4" in got["op_inventory"]
    assert stack.choose_stack(compat, None, "2.10.0.post4")["op_inventory_matches"]


def test_a_known_bad_release_in_the_knowledge_base_moves_the_choice() -> None:
    note = "Known bad: vllm-ascend 0.23.0 its CANN kernels hang on this cluster\n"
    got = stack.choose_stack(load_compat(), lambda q, k: [_Hit(note)], None)
    assert got["known_bad_from"] == "the knowledge base"
    assert got["chosen"]["vllm_ascend"] == "0.18.0"  # the next final release, not a release candidate
    assert "hang on this cluster (user-notes/stacks.md)" in got["note"]
    lines = "\n".join(stack.stack_lines(got))
    assert "vllm-ascend 0.18.0" in lines and "torch_npu 2.9.0.post1+git4c901a4" in lines
