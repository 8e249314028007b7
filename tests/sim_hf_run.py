"""Run small transformers models on ascend-sim and on the CPU; print one JSON line of what happened.

Used by tests/test_ascend_sim_libraries.py in a real `python -I` subprocess with the emulator installed
by the same bootstrap the sandbox harness calls (`sandbox.ascend_sim:install`). The models are built
from transformers' own classes, from config, with random weights under a fixed seed.

usage: sim_hf_run.py ORDER MODEL[,MODEL...] ATTN[,ATTN...]
  ORDER: "sim-first" (install, then import the libraries) or "libs-first" (the other way round)
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _llama(attn: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg)


def _qwen2(attn: str) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=attn)
    return Qwen2ForCausalLM(cfg)


IMAGE_TOKEN = 95


def _llava(attn: str) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                      vision_feature_layer=-1, vision_feature_select_strategy="default",
                      attn_implementation=attn)
    return LlavaForConditionalGeneration(cfg)


# llama_padded: a left-padded batch of two, which takes the varlen (TND) form of the flash-attention path.
BUILDERS = {"llama": _llama, "llama_padded": _llama, "qwen2": _qwen2, "llava": _llava}


def _inputs(name: str, device: str) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 90, (1, 6), generator=g)
    if name == "llama_padded":
        ids = torch.randint(1, 90, (2, 6), generator=g)
        mask = torch.ones_like(ids)
        ids[1, :2] = 0
        mask[1, :2] = 0
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if name != "llava":
        return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
    patches = (32 // 8) ** 2  # "default" strategy drops CLS: one token per patch
    ids = torch.cat([ids[:, :1], torch.full((1, patches), IMAGE_TOKEN), ids[:, 1:]], dim=1)
    pixels = torch.randn(1, 3, 32, 32, generator=g)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "pixel_values": pixels.to(device)}


def _generate(model: Any, name: str, device: str) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(**_inputs(name, device), max_new_tokens=4, do_sample=False, pad_token_id=0)
    return [int(t) for row in out.cpu().tolist() for t in row]


def main() -> int:
    order, models, attns = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    if order == "libs-first":
        # Both probe at import: accelerate.state calls is_npu_available(check_device=False) (cached), and
        # transformers' sdpa integration keeps is_torch_npu_available() in a module constant.
        import accelerate
        import transformers
        import transformers.integrations.sdpa_attention

        from sandbox import ascend_sim

        ascend_sim.install({})
    else:
        from sandbox import ascend_sim

        ascend_sim.install({})
        import accelerate
        import transformers

    import importlib.metadata
    import importlib.util

    import torch
    from accelerate import PartialState
    from accelerate.utils import is_npu_available
    from transformers.utils import is_torch_npu_available

    out: dict[str, Any] = {
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "find_spec": importlib.util.find_spec("torch_npu") is not None,
        "torch_npu_version": importlib.metadata.version("torch-npu"),
        "is_torch_npu_available": is_torch_npu_available(),
        # both cache keys: accelerate's own import-time call passes check_device=False
        "accelerate_is_npu_available": is_npu_available() and is_npu_available(check_device=False),
        "accelerate_device": str(PartialState().device),
        "accelerator": str(torch.accelerator.current_accelerator()),
        "sdpa_npu_flag": __import__("transformers.integrations.sdpa_attention", fromlist=["x"])._is_torch_npu_available,
        "runs": [],
    }
    for name in models:
        for attn in attns:
            torch.manual_seed(0)
            model = BUILDERS[name]("eager" if attn == "flash_attention_2" else attn).eval()
            cpu = _generate(model, name, "cpu")
            # flash_attention_2 has no CPU kernel: the CPU reference runs eager, the npu run takes
            # transformers' Ascend path (integrations/npu_flash_attention -> torch_npu.npu_fusion_attention).
            model.set_attn_implementation(attn) if attn == "flash_attention_2" else None
            model.to("npu")
            ascend_sim.reset()
            npu = _generate(model, name, "npu")
            report = ascend_sim.op_report()
            out["runs"].append({
                "model": name, "attn": attn, "cpu": cpu, "npu": npu,
                "param_device": str(next(model.parameters()).device),
                "fusion_attention_calls": report["npu_ops"].get("npu::npu_fusion_attention", 0),
                "op_total": report["op_total"],
            })
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
