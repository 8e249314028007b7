"""The demo's exit after its own verify (api/cli.py ``_demo_verdict``): a busy host's uncheckable throughput is
said, not a failure, once the port's tokens were re-checked and agree; a disagreement, or tokens not re-checked,
fails the demo (the README's first command, run by CI on a loaded machine)."""

from __future__ import annotations

from agents.deploy.verify import Claim, VerifyResult
from api.cli import _demo_verdict
from api.cli_port import EXIT_NOT_VALIDATED, EXIT_OK


def _result(tokens: str, throughput: str) -> VerifyResult:
    return VerifyResult(bundle="b", claims=[Claim(name="patch applies", verdict="agree"),
                                            Claim(name="tokens match", verdict=tokens),  # type: ignore[arg-type]
                                            Claim(name="throughput", verdict=throughput)])  # type: ignore[arg-type]


def test_a_noisy_throughput_with_agreeing_tokens_keeps_the_demo_green() -> None:
    assert _demo_verdict(_result("agree", "unchecked"), EXIT_OK) == EXIT_OK


def test_a_disagreement_or_unchecked_tokens_fail_the_demo() -> None:
    assert _demo_verdict(_result("agree", "disagree"), EXIT_OK) == EXIT_NOT_VALIDATED
    assert _demo_verdict(_result("unchecked", "unchecked"), EXIT_OK) == EXIT_NOT_VALIDATED
    assert _demo_verdict(_result("disagree", "agree"), EXIT_OK) == EXIT_NOT_VALIDATED
    assert _demo_verdict(_result("agree", "agree"), EXIT_OK) == EXIT_OK
