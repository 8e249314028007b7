"""The projection of a port's deployment on the chip the user named: throughput, latency and memory of vLLM
serving the full-size model on an Ascend chip (issue 44; docs/deploy.md, "Projected on a chip").

- ``lm_config``: the language model's sizes from config.json, under any of the spellings configs use.
- ``cost``: the typed model of the model (``ModelCost``: parameters, FLOPs and bytes per token by layer kind,
  the KV cache per token, the vision encoder per image).
- ``structure``: ``ModelCost`` from the model built on the meta device from its own code (the sandboxed
  inventory of sandbox/harness/meta_inventory.py): kinds read from the modules' types and parameter shapes.
- ``config_cost``: ``ModelCost`` from config arithmetic, where the meta build fails (and says so).
- ``hardware``: a chip's public figures (sandbox/targets/chips.py) or a measured CPU profile, as one record.
- ``engine``: the engine's efficiency (share of peak compute and bandwidth, per-layer and per-sequence host
  overhead, graph mode vs eager) and its calibration on published figures (agents/data/published_serving.yaml).
- ``project``: the projection itself, per concurrency, with the bound that decides each figure.
- ``model_source``: where the model, its environment and its op inventory come from (a bundle or a folder).
- ``render``: the projection as text (the CLI), as a report section, and as the CLI's JSON.

May import: agents core, sandbox, knowledge. Imported by api (``npuport project``), agents.report (the
report's section) and agents.deploy (serve.sh sized for the chip); it imports neither.
"""
