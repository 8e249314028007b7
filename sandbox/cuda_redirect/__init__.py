"""What stands in for CUDA on a host without it: ``redirect`` (``cuda -> cpu`` for the reference run,
``cuda -> npu`` as torch_npu's ``transfer_to_npu`` does), ``cpu_stand_ins`` (streams, events, graphs and
device properties on the CPU) and ``cuda_only`` (the one table of libraries that exist only for CUDA,
stubbed when the original imports them unguarded). The harness installs it for a run, and the emulated
torch_npu's ``transfer_to_npu`` installs it too, so it sits below both.

May import: the standard library and torch; nothing of npuport.
"""
