"""One run of a model in the sandbox. The parent side is ``runner`` (writes the run's spec, starts the
worker under the supervisor, reads its result); the worker is ``worker`` (``python -m
sandbox.harness.worker SPEC.json``: imports the model as remote code, builds it with ``model_build``
from a config that ``shrink`` derives (``shrink_layers``: one layer of every kind the config names;
``shrink_code``: the sizes the code fixes) and ``shrink_fit`` fits to the constructor, seeds its weights,
feeds it the inputs of ``sandbox.inputs`` and runs it, ``coverage`` recording which layer kinds, towers and
parts ran). Around the model: the device redirect
(``sandbox.cuda_redirect``), ``hub_offline`` (sub-models named
by Hub id, built offline), ``init_shapes`` (a weight init that reshapes a parameter undone), ``profile``
and ``profile_counters`` (the decode profile); ``meta_inventory`` (a child of its own: the full-size model built
on the meta device and its modules' types and shapes read back, for agents/projection).

May import: ``sandbox.inputs``, ``sandbox.isolation``, ``sandbox.targets``, ``sandbox.ascend_sim``,
``sandbox.cuda_redirect``, ``knowledge``. Not ``sandbox.bench`` or ``sandbox.serving`` (they sit above it).
"""
