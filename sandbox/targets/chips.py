"""The Ascend chips npuport knows. Add a chip: one ``Chip`` record here (and, for the emulator, a
profile in sandbox/ascend_sim/profiles.py); docs/architecture.md, "Add a chip".

``perf`` holds the public figures a projection of serving needs (agents/projection), each with where it
is published. Huawei publishes few of them on one page; where third-party pages disagree, the figure
chosen and the spread are both given. A constant error in a peak figure is absorbed by the engine
efficiency npuport calibrates on published throughput for the same chip (agents/data/published_serving.yaml),
so the spread matters most across chips."""

from __future__ import annotations

from sandbox.targets.base import Chip, ChipPerf

_MATRIX = "op-plugin matrix of the torch_npu build (knowledge/op_matrix.py)"
_VLLM_ASCEND = "https://docs.vllm.ai/projects/ascend/en/latest/tutorials/models"

_A2 = ChipPerf(
    peak_tflops={"bfloat16": 313.0, "float16": 313.0, "int8": 626.0},
    hbm_gib=64.0, hbm_gbps=1600.0, cards_per_node=8,
    interconnect="HCCS, full mesh within an 8-NPU node; RoCE between nodes", interconnect_gbps=392.0,
    sources={
        "peak_tflops.float16": f"{_VLLM_ASCEND}/DeepSeekOCR2.html (hardware 'A2-313T': a 313 TFLOPS half-precision "
                               "A2 device; third-party pages give 280-376 for 910B4..910B2)",
        "peak_tflops.int8": "twice the half-precision cube peak, as Huawei publishes for the Ascend 910 line "
                            "(256 TFLOPS FP16 / 512 TOPS INT8: https://www.besthub.dev/articles/how-huawei-ascend-910-"
                            "redefines-ai-training-performance-d95c7f11f1dc)",
        "hbm_gib": f"{_VLLM_ASCEND}/gpt-oss-120b.html ('1 Atlas 800 A2 (64GB x 8) nodes')",
        "hbm_gbps": "third-party: 1.2 TB/s (https://awesomeagents.ai/hardware/huawei-ascend-910c) to 2 TB/s "
                    "(https://www.orientdeck.com/tech-trend/ai-robotics/9209.html); 1.6 TB/s, the middle, is used",
        "cards_per_node": f"{_VLLM_ASCEND}/gpt-oss-120b.html (Atlas 800 A2: 64GB x 8)",
        "interconnect_gbps": "7 HCCS links of 56 GB/s per NPU, the figure third-party pages cite; no Huawei page "
                             "found. Only tensor-parallel all-reduce volume reads it (latency dominates)",
    })

_A3 = ChipPerf(
    peak_tflops={"bfloat16": 376.0, "float16": 376.0, "int8": 752.0},
    hbm_gib=64.0, hbm_gbps=1600.0, cards_per_node=16,
    interconnect="HCCS/UB within a 16-die node (two dies per package joined by SIO)", interconnect_gbps=392.0,
    sources={
        "peak_tflops.float16": f"{_VLLM_ASCEND}/DeepSeek-V3.1.html (hardware 'A3-752T': 752 TFLOPS per two-die "
                               "package, 376 per die, the device vLLM counts)",
        "peak_tflops.int8": "twice the half-precision cube peak (as for the 910 line)",
        "hbm_gib": f"{_VLLM_ASCEND}/DeepSeekOCR2.html ('1 Atlas 800 A3 server (64GB x 16 NPUs)')",
        "hbm_gbps": "third-party: 3.2 TB/s per package (1.8 TB/s in https://awesomeagents.ai/hardware/huawei-ascend-"
                    "910c); 1.6 TB/s per die is used",
        "cards_per_node": f"{_VLLM_ASCEND}/Kimi-K2-Thinking.html ('one Atlas 800 A3 node (64G x 16)')",
        "interconnect_gbps": "784 GB/s per 910C package (https://www.besthub.dev/articles/how-huawei-s-ascend-ai-"
                             "chips-evolve-from-910c-to-970-architecture-performance-and-market-impact-4c7a0b36c890), "
                             "half per die",
    })

_310P = ChipPerf(
    peak_tflops={"float16": 70.0, "int8": 140.0},
    hbm_gib=24.0, hbm_gbps=204.8, cards_per_node=8,
    interconnect="PCIe 4.0 x16 (no HCCS between cards)", interconnect_gbps=32.0,
    sources={
        "peak_tflops.int8": "Atlas 300I Duo: 280 TOPS INT8 for its two 310P processors (https://avalanchenoticias.com."
                            "br/servidores-clusters-supercomputadores-computadores-industriais-e-multiprocessadores/o-"
                            "acelerador-huawei-atlas-300i-duo-e-equipado-com-um-par-de-chips-ascend-310-ai)",
        "peak_tflops.float16": "half the INT8 figure, as for the 910 line",
        "hbm_gib": "Atlas 300I Pro: 24 GB LPDDR4X per processor (the Duo's 96 GB / 48 GB per processor is larger)",
        "hbm_gbps": "Atlas 300I Duo: 408 GB/s for two processors (same page as the INT8 figure), 204 per processor",
        "cards_per_node": "Atlas 800 inference server (model 3000): up to 4 Atlas 300I Duo cards of 2 processors "
                          "(https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/"
                          "dl_affinity_0009.html)",
        "interconnect_gbps": "PCIe 4.0 x16, about 32 GB/s",
    })

CHIPS: tuple[Chip, ...] = (
    Chip(key="910b", product="Atlas A2 training/inference series (Atlas 800T/800I A2)", memory_gib=64.0,
         dtypes=("float32", "float16", "bfloat16"), op_support=_MATRIX, serve_dtype="bfloat16",
         aliases=("a2", "910b3", "910b1", "910b2", "910b4"), perf=_A2),
    Chip(key="a3", product="Atlas A3 training/inference series (Atlas 800T/800I A3, super-pod)", memory_gib=64.0,
         dtypes=("float32", "float16", "bfloat16"), op_support=_MATRIX, serve_dtype="bfloat16", perf=_A3),
    Chip(key="310p", product="Atlas 300I Pro / 300I Duo inference cards", memory_gib=24.0,
         dtypes=("float32", "float16"), op_support=_MATRIX + "; no bfloat16 kernels, many fused ops are A2/A3 only",
         serve_dtype="float16", aliases=("310p3",),
         serve_note="Ascend 310P has no bfloat16 kernels, so it serves float16", doc_words=("310p", "300i"),
         perf=_310P),
)
