"""Tuning: typed search spaces per target, constraints that prune them, the search, and the
benchmark-backed evaluation of a port (see docs/tuning.md)."""

from agents.tuning.constraints import Constraint, prune
from agents.tuning.search import Budget, Outcome, TuneResult, npuport_search
from agents.tuning.space import HostFacts, ModelFacts, SearchSpace, model_facts, torch_space
from knowledge.errors import NoFeasiblePoint

__all__ = ["Budget", "Constraint", "HostFacts", "ModelFacts", "NoFeasiblePoint", "Outcome", "SearchSpace",
           "TuneResult", "model_facts", "npuport_search", "prune", "torch_space"]
