"""A memrl :class:`~memrl.policy.base.PolicyClient` over verl's LLM servers (``AgentLoopBase.server_manager``).

verl's servers are re-synced with the actor's weights after every update, so a memrl episode that generates
through them always samples from the current policy. The client speaks token ids both ways, as memrl's
contract does: ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` returns verl's
``TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``).

memrl's episode code is synchronous and runs in a worker thread; :meth:`VerlServerPolicy.generate` submits all
samples of one batched call to the agent-loop worker's event loop at once and waits for them, so the servers see
them concurrently (verl's load balancer spreads them).

What verl's servers give and what they do not:

- sampling (``temperature``, ``top_p``, ``top_k``) is verl's, per call (:attr:`sampling`, set from the
  ``sampling_params`` verl hands the agent loop; greedy during validation): verl's actor recomputes log-probs
  under its own rollout temperature, so memrl's ``rollout.temperature`` / ``top_p`` are not used here, except
  that a request memrl makes greedy (temperature 0: the trunk reply of a memory write, a snapshot fork's answer,
  writes of a writer that is not trained) stays greedy;
- ``max_tokens``, ``stop`` and ``stop_token_ids`` are memrl's, per request (vLLM's sampling keys; the stop
  string is kept in the output, ``include_stop_str_in_output``);
- only the sampled token's log-prob comes back, so ``top_logprobs`` is empty: tree search ranks nodes by the
  sampled tokens' surprisal instead of top-k entropy (:func:`memrl.rollout.expansion.output_entropies`,
  ``docs/verl.md``);
- requests carry full token sequences: prefix reuse is the servers' own (vLLM / SGLang prefix caching);
- the weight version each output was sampled under (``TokenOutput.extra_fields``: ``min_global_steps`` /
  ``max_global_steps``, verl's staleness bookkeeping) is gathered across calls and handed over by
  :meth:`VerlServerPolicy.take_weight_versions`;
- :meth:`VerlServerPolicy.logprobs` (training-time scoring) is not offered: verl's actor computes the
  training log-probs itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.policy.base import GenerationRequest
from memrl.policy.errors import PolicyError
from memrl.types import FinishReason, GenerationOutput

# verl's per-call sampling keys that pass through to the server unchanged.
VERL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class VerlServerPolicy:
    """PolicyClient adapter: memrl ``GenerationRequest`` → ``server_manager.generate`` → ``GenerationOutput``.

    ``client`` is verl's ``LLMServerClient`` (or anything with its async ``generate``); ``loop`` the event loop
    it runs on (the agent-loop worker's). Call :meth:`generate` from another thread, never from ``loop``.
    """

    def __init__(self, client: Any, tokenizer: Any, loop: asyncio.AbstractEventLoop, *, max_model_len=None):
        self.client = client
        self.tokenizer = tokenizer
        self.loop = loop
        self.max_model_len = max_model_len
        self.sampling: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}
        self._versions: list[int] = []

    def take_weight_versions(self) -> tuple[int | None, int | None]:
        """The oldest and newest actor weight version (verl's ``global_steps``) of the outputs since the last
        call, ``(None, None)`` when the servers reported none; then starts over."""
        seen, self._versions = self._versions, []
        return (min(seen), max(seen)) if seen else (None, None)

    def set_sampling(self, sampling_params: Mapping[str, Any]) -> None:
        """Use verl's sampling for the calls that follow (the keys in :data:`VERL_SAMPLING_KEYS`)."""
        self.sampling = {k: sampling_params[k] for k in VERL_SAMPLING_KEYS if k in sampling_params}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        if _running_loop() is self.loop:
            raise PolicyError(
                "VerlServerPolicy.generate was called on its event loop's thread (it would block it)"
            )
        calls = [(req, self._params(req)) for req in requests for _ in range(req.params.n)]
        future = asyncio.run_coroutine_threadsafe(self._all(calls), self.loop)
        try:
            outs = future.result()
        except PolicyError:
            raise
        except Exception as exc:  # a server or transport failure is infrastructure, never one episode's fault
            raise PolicyError(f"verl server_manager.generate failed: {type(exc).__name__}: {exc}") from exc
        flat = iter(self._convert(req, params, out) for (req, params), out in zip(calls, outs, strict=True))
        return [[next(flat) for _ in range(req.params.n)] for req in requests]

    async def _all(self, calls: list[tuple[GenerationRequest, dict[str, Any]]]) -> list[Any]:
        return await asyncio.gather(
            *(
                self.client.generate(
                    uuid.uuid4().hex, prompt_ids=list(req.prompt_ids), sampling_params=params
                )
                for req, params in calls
            )
        )

    def _params(self, req: GenerationRequest) -> dict[str, Any]:
        p = req.params
        params = dict(self.sampling, max_tokens=p.max_tokens, logprobs=True)
        if (
            p.temperature == 0
        ):  # memrl asked for greedy (a write's trunk reply, snapshot answers): kept greedy
            params.update(temperature=0.0, top_p=1.0, top_k=-1)
        if p.stop:
            params.update(stop=list(p.stop), include_stop_str_in_output=True)
        if p.stop_token_ids:
            params["stop_token_ids"] = list(p.stop_token_ids)
        return params

    def _convert(self, req: GenerationRequest, params: dict[str, Any], out: Any) -> GenerationOutput:
        ids = tuple(int(t) for t in out.token_ids)
        if out.log_probs is None or len(out.log_probs) != len(ids):
            raise PolicyError(
                "verl's server returned no per-token log-probs (memrl needs them for its trajectories); "
                "the server must honour sampling_params['logprobs']=True"
            )
        extra = getattr(out, "extra_fields", None) or {}
        self._versions += [
            int(extra[k]) for k in ("min_global_steps", "max_global_steps") if extra.get(k) is not None
        ]
        # vLLM can report a log-prob a hair above 0 for a certain token; clamp so the contract holds.
        lps = tuple(min(0.0, float(lp)) for lp in out.log_probs)
        if getattr(out, "stop_reason", None) == "aborted":
            finish = FinishReason.ABORT
        elif len(ids) >= params["max_tokens"]:
            finish = FinishReason.LENGTH
        else:
            finish = FinishReason.STOP
        return GenerationOutput(
            token_ids=ids,
            logprobs=lps,
            finish_reason=finish,
            stop_reason=self._stop_reason(req, ids) if finish is FinishReason.STOP else None,
            prompt_token_ids=req.prompt_ids,
        )

    def _stop_reason(self, req: GenerationRequest, ids: tuple[int, ...]) -> str | int | None:
        """Which stop fired: the servers report only that generation completed, so read it off the output."""
        if ids and ids[-1] in req.params.stop_token_ids:
            return ids[-1]
        if req.params.stop and ids:
            tail = self.tokenizer.decode(list(ids[-16:]))
            for stop in req.params.stop:
                if tail.endswith(stop):
                    return stop
        return None

    def logprobs(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], **_: Any
    ) -> list[list[float]]:
        raise PolicyError(
            "VerlServerPolicy does not score sequences: verl's actor computes training log-probs itself"
        )
