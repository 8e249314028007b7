"""The tuner's benchmark in the sandbox: ``throughput`` runs the model under the supervisor at each
configuration, batch and concurrency point the tuner asks for (the parent's ``run_bench`` and the
worker's ``main``); ``measure`` rebuilds every point's throughput and latencies from the supervisor's
clock, never from the model process's own claims.

May import: ``sandbox.harness``, ``sandbox.inputs``, ``sandbox.isolation``, ``knowledge``.
"""
