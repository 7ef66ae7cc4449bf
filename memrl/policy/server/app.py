"""An OpenAI-compatible server over an in-process PolicyClient (``memrl serve``).

``/v1/completions`` speaks the subset of vLLM's API that token-in/token-out RL clients use: ``prompt`` as token
ids (or text, or a list of either), ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``stop_token_ids``, ``logprobs=k`` (sampled-token logprob + top-k), ``echo`` (prompt logprobs, for scoring) and
``return_tokens_as_token_ids`` (tokens as ``"token_id:<id>"``). Choices carry vLLM's ``stop_reason``; usage
carries ``prompt_tokens_details.cached_tokens``. ``/v1/chat/completions`` renders ``messages`` with the model's
chat template and answers in OpenAI's chat shape (``logprobs`` / ``top_logprobs`` included). Both stream
server-sent events with ``stream=true``: from the decode loop as tokens are sampled where the backend has a
``stream()`` (the HF backend; :mod:`memrl.policy.server.stream`), else once one ``generate`` call has finished. Parameters the server
does not serve are refused with a 400 naming them (:mod:`memrl.policy.server.api`). Loopback only by default:
there is no authentication.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.policy.server.api import APIError, ChatRequest, CompletionRequest, validation_error
from memrl.policy.server.format import (
    Answer,
    Reply,
    chat_chunks,
    chat_logprob_entries,
    completion_chunks,
    completion_logprobs,
    sse,
    usage,
)
from memrl.policy.server.stream import LiveGeneration, TextStream, answer_text, events_of
from memrl.templates import encode_chat
from memrl.types import GenerationOutput

logger = logging.getLogger(__name__)


def _prompts(tokenizer, prompt) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    prompts = [
        list(p) if not isinstance(p, str) else list(tokenizer(p, add_special_tokens=False)["input_ids"])
        for p in prompt
    ]
    if not prompts or not all(prompts):
        raise APIError("prompt: must hold at least one token", "prompt", "invalid_value")
    return prompts


def _completion_choice(tokenizer, a: Answer, prompt: list[int], body: CompletionRequest, prompt_lps) -> dict:
    ids = (list(prompt) if body.echo else []) + list(a.out.token_ids)
    text = (tokenizer.decode(list(prompt), skip_special_tokens=True) if body.echo else "") + a.text
    logprobs = None
    if body.logprobs is not None:
        tops: list[dict | None] = list(a.out.top_logprobs) or [{} for _ in a.out.token_ids]
        token_lps: list[float | None] = list(a.out.logprobs)
        if body.echo:
            token_lps = [None, *prompt_lps, *token_lps]
            tops = [None] * len(prompt) + tops
        logprobs = completion_logprobs(tokenizer, ids, token_lps, tops, body.return_tokens_as_token_ids)
    return {
        "index": a.index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": a.out.finish_reason.value,
        "stop_reason": a.out.stop_reason,
    }


def _chat_entries(tokenizer, out: GenerationOutput) -> list[dict]:
    tops = out.top_logprobs or ({},) * len(out.token_ids)
    return chat_logprob_entries(tokenizer, out.token_ids, out.logprobs, tops)


def _chat_choice(tokenizer, a: Answer, logprobs: bool) -> dict:
    return {
        "index": a.index,
        "message": {"role": "assistant", "content": a.text},
        "logprobs": {"content": _chat_entries(tokenizer, a.out), "refusal": None} if logprobs else None,
        "finish_reason": a.out.finish_reason.value,
    }


def _answers(tokenizer, outputs: Sequence[Sequence[GenerationOutput]], n: int, include_stop: bool):
    return [
        Answer(i * n + j, out, answer_text(tokenizer, out, include_stop))
        for i, outs in enumerate(outputs)
        for j, out in enumerate(outs)
    ]


def _chat_prompt(tokenizer, body: ChatRequest) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise APIError("the served model has no chat template: use /v1/completions", "messages")
    try:
        return encode_chat(tokenizer, [m.as_template_message() for m in body.messages])
    except Exception as exc:  # jinja raises on conversations a template rejects (e.g. roles out of order)
        raise APIError(f"messages: the chat template rejected them: {exc}", "messages") from exc


def _texts(tokenizer, count: int, body) -> dict[int, TextStream]:
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    return {i: TextStream(tokenizer, stops, body.include_stop_str_in_output) for i in range(count)}


def stream_response(reply: Reply, obj: str, chunks: Iterator[dict], used: Callable[[], dict] | None) -> Any:
    """``chunks`` as server-sent events; with ``stream_options.include_usage`` OpenAI's last chunk follows:
    no choices, the request's usage (``used()``, read once every chunk has been sent)."""
    from fastapi.responses import StreamingResponse

    def events():
        try:
            yield from chunks
        except Exception as exc:  # the response has begun: the failure reaches the client as an error event
            logger.exception("stream failed")
            yield APIError(f"{type(exc).__name__}: {exc}", status=500).body()
            return
        if used is not None:
            yield reply.envelope(obj, [], usage=used())

    return StreamingResponse(sse(events()), media_type="text/event-stream")


class PolicyService:
    """The endpoints' work over one policy. Calls into the policy are serialised by one lock (in-process
    backends are not thread-safe); the server still accepts many connections."""

    def __init__(self, policy: PolicyClient, model_name: str) -> None:
        self.policy, self.model_name, self.tokenizer = policy, model_name, policy.tokenizer
        self.lock = threading.Lock()
        # A chat request without a token limit may fill the rest of the context window, as OpenAI's may.
        self.room = int(getattr(policy, "max_model_len", None) or policy.cfg.max_model_len)

    def generate(self, prompts: list[list[int]], params: SamplingParams, echo: bool = False):
        requests = [GenerationRequest(tuple(p), params) for p in prompts]
        with self.lock:
            outputs = self.policy.generate(requests)
            prompt_lps = (
                self.policy.logprobs([(p[:1], p[1:]) for p in prompts]) if echo else [None] * len(prompts)
            )
        return outputs, prompt_lps

    def token_events(self, prompts: list[list[int]], params: SamplingParams):
        """The answers' token events and a callable giving their outputs once the events have been read: live
        from the decode loop where the backend has a ``stream()``, else split from one ``generate`` call."""
        if not callable(getattr(self.policy, "stream", None)):
            outputs, _ = self.generate(prompts, params)
            return events_of(outputs, params.n), lambda: outputs
        requests = [GenerationRequest(tuple(p), params) for p in prompts]
        live = LiveGeneration(self.policy, requests, self.lock, params.n)
        events = iter(live)
        first = next(events, None)  # a failure before the first token still gets an HTTP error status
        return itertools.chain([] if first is None else [first], events), lambda: live.outputs

    def completions(self, body: CompletionRequest) -> Any:
        body.check_served()
        prompts = _prompts(self.tokenizer, body.prompt)
        params = body.sampling(body.max_tokens, body.logprobs or 0)
        reply = Reply(body.model or self.model_name, "cmpl")
        if body.stream:
            events, outputs = self.token_events(prompts, params)
            texts = _texts(self.tokenizer, len(prompts) * body.n, body)
            chunks = completion_chunks(reply, events, texts, body.logprobs, body.return_tokens_as_token_ids)
            used = (lambda: usage(prompts, outputs())) if body.include_usage else None
            return stream_response(reply, "text_completion", chunks, used)
        outputs, prompt_lps = self.generate(prompts, params, body.echo)
        answers = _answers(self.tokenizer, outputs, body.n, body.include_stop_str_in_output)
        choices = [
            _completion_choice(
                self.tokenizer, a, prompts[a.index // body.n], body, prompt_lps[a.index // body.n]
            )
            for a in answers
        ]
        return reply.envelope("text_completion", choices, usage=usage(prompts, outputs))

    def chat(self, body: ChatRequest) -> Any:
        body.check_served()
        prompt = _chat_prompt(self.tokenizer, body)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        params = body.sampling(body.token_limit(self.room - len(prompt)), top)
        reply = Reply(body.model or self.model_name, "chatcmpl")
        if body.stream:
            events, outputs = self.token_events([prompt], params)
            chunks = chat_chunks(reply, events, _texts(self.tokenizer, body.n, body), body.logprobs)
            used = (lambda: usage([prompt], outputs())) if body.include_usage else None
            return stream_response(reply, "chat.completion.chunk", chunks, used)
        outputs, _ = self.generate([prompt], params)
        answers = _answers(self.tokenizer, outputs, body.n, body.include_stop_str_in_output)
        choices = [_chat_choice(self.tokenizer, a, body.logprobs) for a in answers]
        return reply.envelope("chat.completion", choices, usage=usage([prompt], outputs))


def create_app(policy: PolicyClient, model_name: str = "memrl"):
    """A FastAPI app serving ``policy`` (see :class:`PolicyService`)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="memrl policy server")
    service = PolicyService(policy, model_name)

    @app.exception_handler(APIError)
    def refused(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    def failed(_: Request, exc: Exception) -> JSONResponse:
        # A backend failure still answers in OpenAI's error shape, so SDK clients raise with the message.
        logger.exception("request failed")
        return JSONResponse(APIError(f"{type(exc).__name__}: {exc}", status=500).body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(list(exc.errors())).body(), status_code=400)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "memrl"}]}

    @app.post("/v1/completions")
    def completions(body: CompletionRequest):
        return service.completions(body)

    @app.post("/v1/chat/completions")
    def chat(body: ChatRequest):
        return service.chat(body)

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
