"""The precision a device runs a model in, shared by the policy (``policy.dtype``) and the embedder
(``memory.embedder_dtype``)."""

from __future__ import annotations


def resolve_dtype(dtype: str, device: str, *, cpu_bf16: str = "avx512") -> str:
    """``dtype`` as a torch dtype name. ``auto``: on CUDA bfloat16 where supported, else float16; on a CPU
    bfloat16 when it has the bf16 matmul instructions ``cpu_bf16`` names, else float32; float32 elsewhere.

    ``cpu_bf16``: ``avx512`` = AVX512-BF16 or AMX (the embedder: MiniLM encodes faster in bf16 on an AVX512-BF16
    CPU, where bf16 elsewhere would be emulated and slower); ``amx`` = AMX tiles only (the policy). The policy runs
    faster in bf16 on an AVX512-BF16 CPU too, but its greedy replies part from float32's on a fraction of rows, so
    ``auto`` keeps it in float32 there, where every recipe's documented numbers were measured; the recipes that
    need the speed set ``policy.dtype: bfloat16`` and show their scores under it (docs/benchmarks.md, "engines")."""
    if dtype != "auto":
        return dtype
    import torch

    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu":
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        avx512 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        return "bfloat16" if amx or (cpu_bf16 == "avx512" and avx512) else "float32"
    return "float32"
