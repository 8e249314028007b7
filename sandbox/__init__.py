"""The sandbox: everything that runs model code, and the walls around it. One room per subsystem,
on floors that import only downwards (pyproject.toml's import-linter contracts hold this):

- ``serving/``, ``bench/``: the deployment check's sandboxed sides and the tuner's benchmark
  (they may import ``harness``, ``inputs``, ``isolation``, ``targets``).
- ``harness/``: one run of a model: the parent's runner and the worker that builds the model, its
  shrunk config, the device redirect and the decode profile (may import every room below it).
- ``isolation/``: the walls (bubblewrap, seccomp, cgroups, the supervisor that holds the clock and the
  result, the run folder as hostile data, confined installs); imports no other room.
- ``inputs/``: the inputs a run feeds the model; these modules ship in the bundle beside run.py, so they
  import nothing of npuport at all.
- ``targets/`` (where a port runs, and its chips), above ``ascend_sim/`` (the emulated Ascend runtime),
  above ``cuda_redirect/`` (what stands in for CUDA: the device redirect both the harness and the emulated
  ``transfer_to_npu`` install).

Nothing in sandbox/ imports ``agents``, ``graph`` or ``api``; ``knowledge`` is below it.
"""
