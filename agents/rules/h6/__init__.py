"""H6, host syncs and Python loops in the decode step: one hazard class in four modules. ``host_sync`` holds
the rule (its detector: ``.item()``/``.tolist()``/``.cpu()`` in the step, per-expert Python loops of MoE
layers, masks built in loops) and the simpler codemods; ``codemods`` vectorises the mask loops (with
``mask_parts``, the parts of a loop body the rewrite understands); ``moe`` turns an expert loop into a
dense dispatch. The recipe is knowledge/recipes/H6.md."""
