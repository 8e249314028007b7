"""Deployment: run.py, serve.sh / set_env.sh (vllm-ascend), requirements, plots, and bundle verify."""

from agents.deploy.bundle import deploy_markdown, write_deploy_bundle
from agents.deploy.verify import Claim, VerifyResult, verify_bundle

__all__ = ["Claim", "VerifyResult", "deploy_markdown", "verify_bundle", "write_deploy_bundle"]
