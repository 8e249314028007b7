"""H4, attention and fused kernels: one hazard class in four modules. ``attention`` holds the rule (its
detector: FlashAttention and xformers calls, attention-implementation selections, hand-written attention
and RMSNorm/rotary blocks the NPU has fused kernels for) and the switch codemods; ``attn_impl`` the one
implementation chosen for the whole model (config.json selections at any level, the model's own
attention table); ``fused`` (RMSNorm, rotary) and ``fused_attention`` (scaled dot-product attention) the
codemods into torch_npu's fused kernels. The recipe is knowledge/recipes/H4.md."""
