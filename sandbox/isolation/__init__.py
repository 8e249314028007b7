"""The walls around model code (docs/security.md): the sandboxes (``process``: process isolation and
bubblewrap; ``bwrap``: its command line; ``confine``: the seccomp filter; ``cgroups``: the run's pids and
memory cgroups; ``reaper``: survivors), the supervisor that alone holds a run's clock and result pipe
(``supervisor``, the parent's reading of it in ``supervised``, the worker's side in ``worker_channel``, the
worker's first code in ``child_main``), the run folder read as hostile data (``rundir``), confined installs and
probes of an environment's interpreter (``installs``, ``probe``, with network only to the package index:
``index_proxy``, ``netgate``), and the model's source checked before anything imports it
(``parse_guard``, ``source_check``).

May import: the standard library, ``knowledge``. No other sandbox room: the supervisor runs with
``python -I -S`` (the standard library and this package only), so this package's ``__init__`` imports
nothing.
"""
