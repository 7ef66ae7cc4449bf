"""An OpenAI-compatible completions server over an in-process PolicyClient (``memrl serve``).

Speaks the subset of vLLM's ``/v1/completions`` that token-in/token-out RL clients use: ``prompt`` as token ids
(or text, or a list of either), ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``stop_token_ids``, ``logprobs=k`` (sampled-token logprob + top-k), ``echo`` (prompt logprobs, for scoring) and
``return_tokens_as_token_ids`` (tokens as ``"token_id:<id>"``). Choices carry vLLM's ``stop_reason``; usage
carries ``prompt_tokens_details.cached_tokens``. Loopback only by default: there is no authentication.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.types import ContractError, GenerationOutput

logger = logging.getLogger(__name__)


class CompletionRequest(BaseModel):
    """The accepted body of ``POST /v1/completions``."""

    model_config = ConfigDict(extra="ignore")  # unknown OpenAI/vLLM fields are accepted and ignored

    model: str | None = None
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    echo: bool = False
    return_tokens_as_token_ids: bool = False


def _prompts(tokenizer, prompt) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    return [
        list(p) if not isinstance(p, str) else list(tokenizer(p, add_special_tokens=False)["input_ids"])
        for p in prompt
    ]


def _token_str(tokenizer, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else tokenizer.decode([tid])


def _choice(tokenizer, index: int, prompt: list[int], out: GenerationOutput, body, prompt_lps) -> dict:
    ids = (list(prompt) if body.echo else []) + list(out.token_ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    logprobs = None
    if body.logprobs is not None:
        as_ids = body.return_tokens_as_token_ids
        tops = list(out.top_logprobs) or [{} for _ in out.token_ids]
        token_lps: list[float | None] = list(out.logprobs)
        top_lps: list[dict | None] = [
            {_token_str(tokenizer, t, as_ids): lp for t, lp in top.items()} for top in tops
        ]
        if body.echo:
            token_lps = [None, *prompt_lps] + token_lps
            top_lps = [None] * len(prompt) + top_lps
        logprobs = {
            "tokens": [_token_str(tokenizer, t, as_ids) for t in ids],
            "token_logprobs": token_lps,
            "top_logprobs": top_lps,
            "text_offset": [],
        }
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason.value,
        "stop_reason": out.stop_reason,
    }


def create_app(policy: PolicyClient, model_name: str = "memrl"):
    """A FastAPI app serving ``policy``. Calls into the policy are serialised (in-process backends are not
    thread-safe); the server still accepts many connections."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI(title="memrl policy server")
    lock = threading.Lock()

    def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "memrl"}]}

    @app.post("/v1/completions")
    def completions(body: CompletionRequest):
        try:
            prompts = _prompts(policy.tokenizer, body.prompt)
            stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
            params = SamplingParams(
                temperature=body.temperature,
                top_p=body.top_p,
                max_tokens=body.max_tokens,
                stop=stop,
                stop_token_ids=tuple(body.stop_token_ids or ()),
                n=body.n,
                seed=body.seed,
                top_logprobs=body.logprobs or 0,
            )
            requests = [GenerationRequest(tuple(p), params) for p in prompts]
        except (ContractError, ValueError, TypeError) as exc:
            return error(400, str(exc))
        with lock:
            outputs = policy.generate(requests)
            prompt_lps = (
                policy.logprobs([(p[:1], p[1:]) for p in prompts]) if body.echo else [None] * len(prompts)
            )
        choices, completion_tokens = [], 0
        for i, (prompt, outs) in enumerate(zip(prompts, outputs, strict=True)):
            for j, out in enumerate(outs):
                choices.append(_choice(policy.tokenizer, i * body.n + j, prompt, out, body, prompt_lps[i]))
                completion_tokens += len(out.token_ids)
        prompt_tokens = sum(len(p) for p in prompts)
        cached = sum(o.cached_tokens for outs in outputs for o in outs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model or model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """Runs a uvicorn server for ``app`` in a daemon thread (tests, benches); ``stop()`` shuts it down cleanly.

    >>> with BackgroundServer(create_app(policy)) as srv:
    ...     OpenAIPolicy(PolicyConfig(backend="openai", base_url=srv.url), tokenizer=policy.tokenizer)
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None) -> None:
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"memrl-serve-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"policy server on {self.url} did not start within {timeout_s}s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
