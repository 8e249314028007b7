"""What stands in for CUDA on a host without it: ``redirect`` (``cuda -> cpu`` for the reference run,
``cuda -> npu`` as torch_npu's ``transfer_to_npu`` does), ``cpu_stand_ins`` (streams, events, graphs and
device properties on the CPU), ``cuda_only`` (the one table of libraries that exist only for CUDA,
stubbed when the original imports them unguarded) and ``sdpa`` (flash-attn's and xformers' attention
through torch's SDPA: the reference run's stand-in, whose source the H16 codemod inserts too). The harness
installs it for a run, and the emulated torch_npu's ``transfer_to_npu`` installs it too, so it sits below
both.

May import: the standard library and torch; nothing of npuport.
"""
