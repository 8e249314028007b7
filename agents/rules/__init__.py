"""Hazard rules: one module per hazard class (h1_cuda_device ... h11_latent), listed by ``registry``.

See docs/rules.md for what a rule holds and how to add one.
"""

from agents.rules.base import ErrorPattern, Fix, HazardRule, Registry, Signature

__all__ = ["ErrorPattern", "Fix", "HazardRule", "Registry", "Signature"]
