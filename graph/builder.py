"""Builds the port state machine (DESIGN §3) and exports ``graph`` for LangGraph Studio.

START -> planner -> environment -> code_reader -> patcher -> executor --ok--> validator --match--> tuner -> reporter
                                                    ^            |fail            |mismatch                  |
                                                    +- debugger <+----------------+        deployer <-(validated,
                                                    serving on)
"""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph

from agents.nodes.code_reader import code_reader_node
from agents.nodes.debugger import debugger_node
from agents.nodes.deployer import deployer_node
from agents.nodes.environment import environment_node
from agents.nodes.executor import executor_node
from agents.nodes.patcher import patcher_node
from agents.nodes.planner import planner_node
from agents.nodes.reporter import reporter_node
from agents.nodes.tuner import tuner_node
from agents.nodes.validator import validator_node
from agents.report.bundle import emergency_report
from graph import routing
from graph.conversation import PlannerInput, with_input, with_reply
from graph.guard import guard
from graph.state import PortInput, PortOutput, PortState

NODES = ("planner", "environment", "code_reader", "patcher", "executor", "validator", "debugger", "tuner", "reporter",
         "deployer")


def build_graph() -> Any:
    # Nodes take the state as a plain dict; typing them against PortState adds nothing here. Every node
    # is guarded (graph/guard.py): an exception becomes a recorded failure and the run goes to the reporter.
    g: Any = StateGraph(PortState, input_schema=PortInput, output_schema=PortOutput)
    g.add_node("planner", guard("planner", with_input(planner_node)), input_schema=PlannerInput)
    g.add_node("environment", guard("environment", environment_node))
    g.add_node("code_reader", guard("code_reader", code_reader_node))
    g.add_node("patcher", guard("patcher", patcher_node))
    g.add_node("executor", guard("executor", executor_node))
    g.add_node("validator", guard("validator", validator_node))
    g.add_node("debugger", guard("debugger", debugger_node))
    g.add_node("tuner", guard("tuner", tuner_node))
    g.add_node("reporter", guard("reporter", with_reply(reporter_node), fallback=emergency_report))
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", routing.after_planner)
    g.add_conditional_edges("environment", routing.after_environment)
    g.add_conditional_edges("code_reader", routing.after_code_reader)
    g.add_conditional_edges("patcher", routing.after_patcher)
    g.add_conditional_edges("executor", routing.after_executor)
    g.add_conditional_edges("validator", routing.after_validator)
    g.add_conditional_edges("debugger", routing.after_debugger)
    # The deployment phase runs after the bundle is written: the bundle stands whatever happens to it.
    g.add_node("deployer", guard("deployer", with_reply(deployer_node)))
    g.add_edge("tuner", "reporter")
    g.add_conditional_edges("reporter", routing.after_reporter, {"deployer": "deployer", "__end__": END})
    g.add_edge("deployer", END)
    return g


def compile_graph(checkpointer: Any = None) -> Any:
    return build_graph().compile(checkpointer=checkpointer, name="npuport")


# LangGraph Studio / `langgraph dev` loads this (langgraph.json); it brings its own checkpointer.
graph = compile_graph()
