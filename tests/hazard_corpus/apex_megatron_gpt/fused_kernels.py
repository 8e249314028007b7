"""Fused ops, Megatron-LM style: Apex kernels when installed, the torch implementation otherwise."""
import torch
import torch.nn.functional as F

try:
    from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction  # HAZARD: cuda-only-import-guarded
    HAVE_PERSIST_LAYER_NORM = True  # HAZARD: kernel-path-flag
except ImportError:
    HAVE_PERSIST_LAYER_NORM = False

try:
    import fused_weight_gradient_mlp_cuda  # noqa: F401
    _grad_accum_fusion_available = True
except ImportError:
    _grad_accum_fusion_available = False


class MixedFusedLayerNorm(torch.nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, no_persist_layer_norm=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,)
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(normalized_shape))
        self.bias = torch.nn.Parameter(torch.zeros(normalized_shape))
        self.no_persist_layer_norm = no_persist_layer_norm or not HAVE_PERSIST_LAYER_NORM

    def forward(self, x):
        if self.no_persist_layer_norm or not x.is_cuda:  # HAZARD: is-cuda-branch
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return FusedLayerNormAffineFunction.apply(x, self.weight, self.bias, self.normalized_shape, self.eps)


@torch.jit.script
def bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
