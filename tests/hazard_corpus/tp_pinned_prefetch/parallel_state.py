"""Process groups for tensor parallelism (a trimmed copy of the usual Megatron/fairscale helpers)."""
import os

import torch
import torch.distributed as dist

_TP_GROUP = None


def initialize_model_parallel(tensor_model_parallel_size=1):
    global _TP_GROUP
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl", init_method="env://")  # HAZARD: nccl-backend
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)  # HAZARD: torch-cuda-api
    world = dist.get_world_size()
    for start in range(0, world, tensor_model_parallel_size):
        ranks = list(range(start, start + tensor_model_parallel_size))
        group = dist.new_group(ranks)  # HAZARD: collective-call
        if dist.get_rank() in ranks:
            _TP_GROUP = group


def get_tensor_model_parallel_group():
    return _TP_GROUP


def get_tensor_model_parallel_world_size():
    return dist.get_world_size(group=_TP_GROUP)
