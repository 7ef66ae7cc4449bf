"""``openai`` backend: any OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ``memrl serve``).

Token in, token out: prompts are sent as token-id lists and ``return_tokens_as_token_ids`` makes the server
name every sampled and top-k token as ``"token_id:<id>"``, so nothing is re-tokenised. Requests run
concurrently (the server batches them). Connection failures, timeouts, 429 and 5xx are retried with
exponential backoff; other 4xx and malformed responses fail at once with :class:`PolicyHTTPError`.

Prefix reuse is the server's: such servers cache token prefixes automatically, and ``cached_tokens`` is taken
from ``usage.prompt_tokens_details.cached_tokens`` when the server reports it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memrl.policy.base import GenerationRequest
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyError, PolicyHTTPError
from memrl.types import FinishReason, GenerationOutput

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _token_id(token: str, where: str) -> int:
    if not isinstance(token, str) or not token.startswith("token_id:"):
        raise ValueError(
            f"{where}: expected 'token_id:<id>' (server must honour return_tokens_as_token_ids), got {token!r}"
        )
    return int(token.split(":", 1)[1])


class OpenAIPolicy:
    """:class:`~memrl.policy.base.PolicyClient` over HTTP. ``tokenizer`` defaults to ``cfg.model``'s."""

    def __init__(self, cfg: PolicyConfig, tokenizer: Any = None) -> None:
        import httpx

        if not cfg.base_url:
            raise PolicyError("the openai backend needs policy.base_url, e.g. http://127.0.0.1:8000")
        self.cfg = cfg
        self.base_url = cfg.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        if tokenizer is None:
            from transformers import AutoTokenizer

            from memrl.policy.models import resolve_model_path

            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
        self.tokenizer = tokenizer
        headers = {}
        key = os.environ.get(cfg.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(timeout=cfg.request_timeout_s, headers=headers)
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_batch_size, thread_name_prefix="memrl-openai")
        self.model_name = cfg.served_model_name or cfg.model

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()

    # ------------------------------------------------------------------ http

    def _post(self, path: str, payload: dict) -> dict:
        """POST with retries; returns the decoded JSON object or raises :class:`PolicyHTTPError`."""
        import httpx

        url = self.base_url + path
        attempts = self.cfg.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                resp = self._http.post(url, json=payload)
            except httpx.ConnectError as exc:
                problem = (
                    f"cannot connect to {url} ({exc}); is the server running? (`memrl serve` starts one)"
                )
                status = None
            except httpx.TimeoutException as exc:
                problem = f"no answer from {url} within {self.cfg.request_timeout_s}s ({type(exc).__name__})"
                status = None
            except httpx.HTTPError as exc:
                problem, status = f"HTTP failure talking to {url}: {exc}", None
            else:
                if resp.status_code < 400:
                    return self._decode(resp, url)
                status = resp.status_code
                problem = f"{url} answered {status}: {resp.text[:500]}"
                if status not in _RETRY_STATUS:
                    raise PolicyHTTPError(problem, url=url, status=status)
            if last:
                raise PolicyHTTPError(
                    f"{problem} (gave up after {attempts} attempts)", url=url, status=status
                )
            wait = self.cfg.retry_backoff_s * (2**attempt)
            logger.warning("%s; retry %d/%d in %.2fs", problem, attempt + 1, attempts - 1, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    @staticmethod
    def _decode(resp, url: str) -> dict:
        try:
            data = resp.json()
        except ValueError as exc:
            raise PolicyHTTPError(
                f"{url} returned malformed JSON ({exc}): {resp.text[:200]!r}",
                url=url,
                status=resp.status_code,
            ) from exc
        if not isinstance(data, dict):
            raise PolicyHTTPError(f"{url} returned {type(data).__name__}, expected a JSON object", url=url)
        return data

    # ------------------------------------------------------------------ generation

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        return list(self._pool.map(self._generate_one, requests))

    def _generate_one(self, req: GenerationRequest) -> list[GenerationOutput]:
        p = req.params
        payload = {
            "model": self.model_name,
            "prompt": list(req.prompt_ids),
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "n": p.n,
            "stop": list(p.stop),
            "stop_token_ids": list(p.stop_token_ids),
            "logprobs": p.top_logprobs,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
        }
        if p.seed is not None:
            payload["seed"] = p.seed
        url = self.base_url + "/v1/completions"
        data = self._post("/v1/completions", payload)
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
            cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            outs = [self._parse_choice(c, req, cached // max(1, len(choices))) for c in choices]
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyHTTPError(f"{url} returned an unexpected completion body: {exc}", url=url) from exc
        if len(outs) != p.n:
            raise PolicyHTTPError(f"{url} returned {len(outs)} choices, expected n={p.n}", url=url)
        return outs

    def _parse_choice(self, choice: dict, req: GenerationRequest, cached: int) -> GenerationOutput:
        lp = choice["logprobs"]
        if lp is None:
            raise ValueError("choice without logprobs")
        ids = [_token_id(t, "logprobs.tokens") for t in lp["tokens"]]
        k = req.params.top_logprobs
        tops = []
        if k > 0:
            for entry in lp["top_logprobs"]:
                pairs = sorted(
                    ((_token_id(t, "top_logprobs"), float(v)) for t, v in entry.items()), key=lambda x: -x[1]
                )
                tops.append(dict(pairs[:k]))  # vLLM may add the sampled token as a (k+1)-th entry
        finish = choice.get("finish_reason") or "abort"
        return GenerationOutput(
            token_ids=tuple(ids),
            logprobs=tuple(float(x) for x in lp["token_logprobs"]),
            finish_reason=FinishReason(finish),
            top_logprobs=tuple(tops),
            stop_reason=choice.get("stop_reason"),
            prompt_token_ids=req.prompt_ids,
            cached_tokens=int(cached),
        )

    # ------------------------------------------------------------------ scoring

    def logprobs(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        """Prompt logprobs via ``echo=True`` (servers report them at temperature 1 only)."""
        if temperature != 1.0:
            raise PolicyError(
                "the openai backend scores at temperature 1 only (servers report raw prompt logprobs)"
            )
        return list(self._pool.map(self._score_one, sequences))

    def _score_one(self, pair: tuple[Sequence[int], Sequence[int]]) -> list[float]:
        prompt, response = list(map(int, pair[0])), list(map(int, pair[1]))
        if not response:
            return []
        payload = {
            "model": self.model_name,
            "prompt": prompt + response,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        url = self.base_url + "/v1/completions"
        data = self._post("/v1/completions", payload)
        try:
            values = data["choices"][0]["logprobs"]["token_logprobs"]
            return [float(v) for v in values[len(prompt) : len(prompt) + len(response)]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyHTTPError(f"{url} returned no prompt logprobs for echo=True: {exc}", url=url) from exc
