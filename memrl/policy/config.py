from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "bfloat16", "float16")
# Backends that need a package of their own (an optional extra), by the module that must import.
_NEEDS = {"vllm": "vllm"}


def first_installed(backend: str) -> str:
    """``vllm|hf``: the first backend whose package is installed (a recipe whose workload one engine serves
    faster names it first); a single name as it is."""
    names = [n.strip() for n in backend.split("|")]
    if len(names) == 1:
        return backend
    for name in names:
        if name not in _NEEDS or importlib.util.find_spec(_NEEDS[name]) is not None:
            if name != names[0]:
                logger.info("policy.backend=%s: %s is not installed, using %s", backend, names[0], name)
            return name
    raise ValueError(f"policy.backend={backend!r}: none of these is installed (vllm needs the vllm extra)")


@dataclass
class PolicyConfig:
    """Which backend generates, with which model, on which device (owned by memrl.policy). Sampling is the
    caller's: each request carries its own (``rollout.temperature``, ``rollout.top_p``).

    ``model`` is an alias of a packaged model (``smollm2-135m``, the embedded SmolLM2-135M-Instruct, see
    :mod:`memrl.policy.models`), a local HF model directory or a hub id. ``dtype = "auto"`` follows the device:
    bfloat16 on CUDA (float16 where bf16 is unsupported) and on CPUs with AMX, else float32 (see
    :func:`memrl.precision.resolve_dtype` for the measurement behind the CPU rule). ``backend`` is a name in
    :data:`memrl.policy.BACKENDS` (``hf``, ``vllm``, ``openai``) or a dotted path to a
    ``(PolicyConfig) -> PolicyClient`` constructor; ``vllm|hf`` takes the first one installed.
    """

    backend: str = "hf"
    model: str = "smollm2-135m"
    lora_path: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    max_model_len: int = 4096
    top_logprobs: int = 5
    base_url: str | None = None
    # --- all backends ---
    seed: int = 0  # seeds requests that carry no seed of their own (reproducible runs)
    # --- hf backend ---
    attn_implementation: str = "sdpa"
    max_batch_size: int = 32  # rows (requests x n) decoded together; more wait and join as rows finish
    score_batch_size: int = 8  # sequences per forward pass in logprobs()
    # KV positions the radix cache keeps (memrl.policy.engine.radix_cache): every finished row leaves its states there
    # and requests continue from their longest cached prefix; least recently used leaves go first; 0 = off.
    # A full cache of SmolLM2-135M in float32 holds ~3.0 GB (30 layers x 2 x 3 kv heads x 64 x 4 bytes a token).
    prefix_cache_tokens: int = 65536
    # Decode with the active LoRA adapter folded into the base weights (memrl.policy.engine.lora_merge): as fast as the
    # bare model, for one extra copy of the adapted layers' weights (false saves that memory, e.g. a large model).
    merge_lora: bool = True
    # On CUDA, replay each decode step from a captured CUDA graph (memrl.policy.engine.cuda_graphs): a small model's step
    # is bound by kernel launches. false runs every step eagerly (e.g. to profile kernels one by one).
    cuda_graphs: bool = True
    # With cuda_graphs: the captured step is torch.compile's forward (fused kernels, fewer to replay); each bucket
    # shape compiles once at its first use.
    compile_decode: bool = False
    # Each decode step also checks up to this many tokens drafted by prompt lookup (memrl.policy.engine.speculative):
    # the same outputs in fewer steps where a row repeats what it has read or written (0 = off). Steps that replay
    # a CUDA graph check none.
    speculative_tokens: int = 4
    # --- openai-compatible http backend ---
    served_model_name: str | None = None  # "model" field sent to the server (default: the model string)
    api_key_env: str = "OPENAI_API_KEY"  # env var read for a bearer token (optional)
    request_timeout_s: float = 120.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    # --- vllm backend ---
    gpu_memory_utilization: float = 0.8
    max_lora_rank: int = 64
    enable_lora: bool = False  # start the engine LoRA-ready without an adapter (load_adapter later)
    vllm_kv_cache_gb: float = 2.0  # VLLM_CPU_KVCACHE_SPACE on CPU hosts
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        self.backend = first_installed(self.backend)
        if self.dtype not in _DTYPES:
            raise ValueError(f"policy.dtype={self.dtype!r}: expected one of {_DTYPES}")
        for name in ("max_model_len", "max_batch_size", "score_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name}={getattr(self, name)}: must be >= 1")
        if self.top_logprobs < 0:
            raise ValueError(f"policy.top_logprobs={self.top_logprobs}: must be >= 0 (0 = none)")
        if self.speculative_tokens < 0:
            raise ValueError(f"policy.speculative_tokens={self.speculative_tokens}: must be >= 0 (0 = off)")
        if self.prefix_cache_tokens < 0:
            raise ValueError(f"policy.prefix_cache_tokens={self.prefix_cache_tokens}: must be >= 0 (0 = off)")
        if self.request_timeout_s <= 0:
            raise ValueError(f"policy.request_timeout_s={self.request_timeout_s}: must be > 0 seconds")
        if self.max_retries < 0 or self.retry_backoff_s < 0:
            raise ValueError(
                "policy.max_retries and policy.retry_backoff_s must be >= 0 (0 = no retry / no wait)"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"policy.gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1]"
            )
        if self.backend == "openai" and not self.base_url:
            raise ValueError(
                "policy.backend='openai' needs policy.base_url, e.g. http://127.0.0.1:8000 "
                "(a vLLM/SGLang server or `memrl serve`)"
            )
