"""The OpenAI request bodies ``memrl serve`` accepts, and the errors it answers with.

Every parameter a body may carry is declared here. A parameter that is not declared (``tools``,
``response_format``, ...) is refused with a 400 that names it, and so is a declared OpenAI parameter set to a
value the server cannot honour (``frequency_penalty=0.5``): a client never gets an answer computed without the
setting it asked for. Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memrl.policy.base import SamplingParams
from memrl.types import ContractError


class APIError(Exception):
    """A request the server refuses; :meth:`body` is the OpenAI error object."""

    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def unsupported(param: str, detail: str) -> APIError:
    return APIError(f"memrl serve does not serve '{param}': {detail}", param, "unsupported_parameter")


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """One 400 for pydantic's errors on a body; an undeclared field is reported as an unsupported parameter."""
    parts, param, code = [], None, "invalid_value"
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        path = ".".join(loc) or "body"
        if err.get("type") == "extra_forbidden":
            parts.append(f"unsupported parameter '{path}' (memrl serve does not serve it)")
            if param is None or code != "unsupported_parameter":
                param, code = path, "unsupported_parameter"
        else:
            parts.append(f"{path}: {err.get('msg', 'invalid')}")
            param = param or path
    return APIError("; ".join(parts) or "invalid request body", param, code)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingBody(_Strict):
    """Parameters both endpoints share. ``stop_token_ids`` and ``include_stop_str_in_output`` are vLLM's."""

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the provider's abuse monitoring: nothing to do here
    # Accepted only at the value that switches them off.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def check_served(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise unsupported(name, f"got {value}; only 0 (no penalty)")
        if self.logit_bias:
            raise unsupported("logit_bias", "only an empty map")
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed with stream=true", "stream_options")

    def sampling(self, max_tokens: int, top_logprobs: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        try:
            return SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                max_tokens=max_tokens,
                stop=stop,
                stop_token_ids=tuple(self.stop_token_ids or ()),
                n=self.n,
                seed=self.seed,
                top_logprobs=top_logprobs,
            )
        except ContractError as exc:  # "SamplingParams.<field>: ..." names the parameter
            found = re.match(r"SamplingParams\.(\w+)", str(exc))
            raise APIError(str(exc), found.group(1) if found else None, "invalid_value") from exc

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingBody):
    """``POST /v1/completions``: ``prompt`` as token ids, text, or a list of either. ``logprobs=k``: the
    sampled token's logprob plus the top k; ``echo``: the prompt (and its logprobs) before the completion;
    ``return_tokens_as_token_ids`` (vLLM): tokens as ``"token_id:<id>"``."""

    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int = 16
    logprobs: int | None = None
    echo: bool = False
    return_tokens_as_token_ids: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_served(self) -> None:
        super().check_served()
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", f"got {self.best_of}; only best_of = n (every sample is returned)")
        if self.suffix:
            raise unsupported("suffix", "insertion (fill-in-the-middle) is not served")
        if self.echo and self.stream:
            raise unsupported("echo", "echo is not served together with stream=true")
        if self.logprobs is not None and self.logprobs < 0:
            raise APIError(f"logprobs: must be >= 0, got {self.logprobs}", "logprobs", "invalid_value")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_template_message(self) -> dict[str, str]:
        # Chat templates know "system"; OpenAI's newer "developer" role means the same to a served model.
        role = "system" if self.role == "developer" else self.role
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": role, "content": text}


class ChatRequest(_SamplingBody):
    """``POST /v1/chat/completions``: ``messages`` go through the model's chat template. ``logprobs=true``
    returns each sampled token's logprob, ``top_logprobs=k`` the k most likely alternatives too. Without
    ``max_tokens`` / ``max_completion_tokens`` the answer may fill the rest of the context window."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def check_served(self) -> None:
        super().check_served()
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise APIError("top_logprobs requires logprobs=true", "top_logprobs", "invalid_value")
            if self.top_logprobs < 0:
                raise APIError("top_logprobs: must be >= 0", "top_logprobs", "invalid_value")
        both = (self.max_tokens, self.max_completion_tokens)
        if None not in both and both[0] != both[1]:
            raise APIError("max_tokens and max_completion_tokens disagree; give one", "max_completion_tokens")

    def token_limit(self, room: int) -> int:
        """The requested limit, else what is left of the context window (``room``)."""
        asked = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return asked if asked is not None else max(1, room)
