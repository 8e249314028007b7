"""The environment stage's skills: which stack a port runs on and the sandbox environment it runs in.

- ``resolve.py``: ``resolve(model_dir, target, torch_npu) -> Resolution`` (the target's stack, the
  model's pins, conflicts in plain words, what to install); ``resolution.py`` (the record, the bundle's
  requirements/constraints); ``stack.py`` (the target's stack, merged pins, vLLM pairing); ``compat.py``
  (agents/data/compat.yaml and the host);
- ``pins.py`` (what the model folder pins, what its code imports), ``imports.py`` (self-imports, guarded
  imports the code demands), ``era.py`` (the transformers of the model's era, reconciling host packages),
  ``torch_pair.py`` (torchvision / torchaudio proven beside the torch they run on);
- ``layered.py``: ``ensure_env(resolution)`` builds (once, cached) the layered venv the sandbox runs;
- ``inventory.py``: the op inventory of a model on a target (``npuport ops``).

docs/environment.md describes the whole.
"""
