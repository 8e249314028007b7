"""The graph's nodes, one module each: thin functions ``state -> update`` over the skills in agents/.

Nodes never import each other (shared code lives in skill modules: agents.request, agents.target_state,
agents.runs, agents.fixing.commits, agents.validation.compare, agents.fixing.diagnosis, agents.tuning.port,
agents.report.bundle), and no skill imports a node; import-linter holds both (pyproject.toml). graph/builder.py wires
them and wraps each in the guard (graph/guard.py).
"""
