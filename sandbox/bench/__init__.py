"""The tuner's benchmark in the sandbox: ``throughput`` (the worker) runs the model at each configuration,
batch and concurrency point the tuner asks for; ``runner`` (the parent's ``run_bench``) writes its
``BenchSpec`` and runs it under the supervisor; ``measure`` rebuilds every point's throughput and latencies from the
supervisor's clock, never from the model process's own claims.

May import: ``sandbox.harness``, ``sandbox.inputs``, ``sandbox.isolation``, ``knowledge``.
"""
