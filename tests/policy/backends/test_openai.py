"""The OpenAI-compatible HTTP backend end to end on loopback through ``memrl serve``'s app (real uvicorn)."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.backends.openai import OpenAIPolicy
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyHTTPError
from memrl.policy.server.app import BackgroundServer, create_app, free_port
from memrl.types import FinishReason


def http_cfg(url: str, **kw) -> PolicyConfig:
    return PolicyConfig(backend="openai", base_url=url, model="random-tiny", **kw)


@pytest.fixture(scope="module")
def served(tiny_hf_policy):
    with BackgroundServer(create_app(tiny_hf_policy, "random-tiny")) as srv:
        client = OpenAIPolicy(http_cfg(srv.url), tokenizer=tiny_hf_policy.tokenizer)
        yield tiny_hf_policy, client
        client.close()


def enc(policy, text):
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def test_http_greedy_tokens_and_logprobs_equal_in_process(served):
    local, remote = served
    prompts = [enc(local, "Where does Ann live?"), enc(local, "x")]
    params = SamplingParams(temperature=0.0, max_tokens=12, top_logprobs=3)
    want = local.generate([GenerationRequest(p, params) for p in prompts])
    got = remote.generate([GenerationRequest(p, params) for p in prompts])
    for [w], [g] in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids and g.finish_reason is w.finish_reason
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)
        assert [list(t) for t in g.top_logprobs] == [list(t) for t in w.top_logprobs]


def test_http_sampling_n_seed_and_stop_reason(served):
    local, remote = served
    prompt = enc(local, "Bob bought a bike")
    params = SamplingParams(temperature=1.0, max_tokens=30, n=2, seed=3)
    [want] = local.generate([GenerationRequest(prompt, params)])
    [got] = remote.generate([GenerationRequest(prompt, params)])
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    stop_id = want[0].token_ids[4]
    stopped = SamplingParams(temperature=1.0, max_tokens=30, seed=3, stop_token_ids=(stop_id,))
    [[out]] = remote.generate([GenerationRequest(prompt, stopped)])
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop_id
    assert out.token_ids[-1] == stop_id
    # The server's radix cache holds the earlier calls' states: reported through usage.prompt_tokens_details.
    [[again]] = remote.generate([GenerationRequest(prompt + out.token_ids, stopped)])
    assert again.cached_tokens > len(prompt) // 2


def test_http_scoring_matches_in_process(served):
    local, remote = served
    pairs = [(enc(local, "prompt one"), enc(local, " the answer")), (enc(local, "p"), ())]
    got, want = remote.logprobs(pairs), local.logprobs(pairs)
    assert got[1] == [] and len(got[0]) == len(pairs[0][1])
    assert torch.allclose(torch.tensor(got[0]), torch.tensor(want[0]), atol=1e-4)


def test_http_4xx_is_not_retried(served):
    local, remote = served
    cfg = http_cfg(remote.base_url, max_retries=3, retry_backoff_s=5.0)  # a retry would take >= 5 s
    client = OpenAIPolicy(cfg, tokenizer=local.tokenizer)
    with pytest.raises(PolicyHTTPError) as err:
        client._post("/v1/completions", {"prompt": [5, 6], "temperature": -1.0})
    assert err.value.status == 400 and "temperature" in str(err.value)
    with pytest.raises(PolicyHTTPError) as err:
        client._post("/v1/completions", {"prompt": {"not": "a prompt"}})
    assert err.value.status == 400 and "prompt" in str(err.value)
    client.close()


def test_connection_refused_names_the_url(tiny_hf_policy):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = OpenAIPolicy(
        http_cfg(url, max_retries=1, retry_backoff_s=0.01), tokenizer=tiny_hf_policy.tokenizer
    )
    with pytest.raises(PolicyHTTPError, match="cannot connect.*gave up after 2 attempts") as err:
        client.generate([GenerationRequest((5, 6), SamplingParams(max_tokens=2))])
    assert err.value.status is None and url in err.value.url
    client.close()


def _flaky_app(script: list[tuple[int, str]]):
    """A server that answers from ``script`` (status, body) in order, then repeats the last answer."""
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI()
    calls = []

    @app.post("/v1/completions")
    def completions() -> Response:
        status, body = script[min(len(calls), len(script) - 1)]
        calls.append(status)
        return Response(body, status_code=status, media_type="application/json")

    return app, calls


GOOD = (
    '{"choices": [{"index": 0, "text": "", "finish_reason": "length", "stop_reason": null, "logprobs": '
    '{"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5}]}}], '
    '"usage": {"prompt_tokens_details": {"cached_tokens": 2}}}'
)


def test_5xx_is_retried_with_backoff_then_succeeds(tiny_hf_policy):
    app, calls = _flaky_app([(503, '{"error": "busy"}'), (500, "oops"), (200, GOOD)])
    with BackgroundServer(app) as srv:
        client = OpenAIPolicy(
            http_cfg(srv.url, max_retries=2, retry_backoff_s=0.01), tokenizer=tiny_hf_policy.tokenizer
        )
        params = SamplingParams(max_tokens=1, top_logprobs=1)
        [[out]] = client.generate([GenerationRequest((5, 6, 7), params)])
        client.close()
    assert calls == [503, 500, 200]
    assert out.token_ids == (7,) and out.logprobs == (-0.5,) and out.cached_tokens == 2


def test_malformed_json_and_missing_token_ids_fail_clearly(tiny_hf_policy):
    bad_token = GOOD.replace('"tokens": ["token_id:7"]', '"tokens": ["a"]')
    for body, match in (("{not json", "malformed JSON"), (bad_token, "token_id")):
        app, calls = _flaky_app([(200, body)])
        with BackgroundServer(app) as srv:
            client = OpenAIPolicy(http_cfg(srv.url, max_retries=2), tokenizer=tiny_hf_policy.tokenizer)
            with pytest.raises(PolicyHTTPError, match=match):
                client.generate([GenerationRequest((5,), SamplingParams(max_tokens=1))])
            client.close()
        assert len(calls) == 1  # a malformed answer is not retried
