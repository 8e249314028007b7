"""The environment stage (node: agents/nodes/environment.py): which stack the model runs in (the era's
transformers, torch pairs, layered venvs), the target in the state, and the op inventory on it."""
