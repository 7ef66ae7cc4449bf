"""``memrl serve``'s app against the official ``openai`` SDK on a loopback port (real uvicorn, tiny random model)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.server.app import BackgroundServer, create_app
from memrl.templates import encode_chat

openai = pytest.importorskip("openai")

MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Where does Ann live?"},
]


@pytest.fixture(scope="module")
def sdk(tiny_hf_policy):
    with BackgroundServer(create_app(tiny_hf_policy, "random-tiny")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        yield tiny_hf_policy, client
        client.close()


def enc(policy, text: str) -> list[int]:
    return list(policy.tokenizer.encode(text, add_special_tokens=False))


def local_answers(policy, prompt, **kw):
    [outs] = policy.generate([GenerationRequest(tuple(prompt), SamplingParams(**kw))])
    return outs


def test_models_list_names_the_served_model(sdk):
    _, client = sdk
    assert [m.id for m in client.models.list().data] == ["random-tiny"]


def test_completions_batched_n2_with_logprobs(sdk):
    policy, client = sdk
    prompts = [enc(policy, "Bob bought a bike"), enc(policy, "x")]
    res = client.completions.create(
        model="random-tiny", prompt=prompts, max_tokens=6, n=2, seed=3, temperature=1.0, logprobs=2
    )
    assert [c.index for c in res.choices] == [0, 1, 2, 3]
    want = local_answers(policy, prompts[1], max_tokens=6, n=2, seed=3, top_logprobs=2)[1]
    got = res.choices[3]
    assert got.logprobs.tokens == [policy.tokenizer.decode([t]) for t in want.token_ids]
    assert got.logprobs.token_logprobs == pytest.approx(list(want.logprobs), abs=1e-4)
    assert all(len(top) == 2 for top in got.logprobs.top_logprobs)
    assert res.usage.completion_tokens == 4 * 6 and res.usage.prompt_tokens == sum(map(len, prompts))


def test_completions_stream_joins_to_the_unstreamed_answer(sdk):
    policy, client = sdk
    kw = {
        "model": "random-tiny",
        "prompt": "Where does Ann live?",
        "max_tokens": 12,
        "seed": 1,
        "logprobs": 1,
    }
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"text_completion"}
    assert len({c.id for c in chunks}) == 1
    usage, chunks = chunks[-1], chunks[:-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 12
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    # The second call reuses the first one's cached prefix states: equal up to float rounding.
    streamed = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(whole.logprobs.token_logprobs, abs=1e-4)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert {c.choices[0].finish_reason for c in chunks[:-1]} == {None}


def test_stop_string_is_left_out_unless_asked_for(sdk):
    policy, client = sdk
    kw = {"model": "random-tiny", "prompt": "Where does Ann live?", "max_tokens": 20, "seed": 2}
    text = client.completions.create(**kw).choices[0].text
    stop = text[-3:-1]
    cut = text.find(stop)
    stopped = client.completions.create(**kw, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[:cut]
    kept = client.completions.create(**kw, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == text[: cut + len(stop)]
    streamed = client.completions.create(**kw, stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:cut]


def test_chat_uses_the_template_and_returns_chat_logprobs(sdk):
    policy, client = sdk
    res = client.chat.completions.create(
        model="random-tiny", messages=MESSAGES, max_tokens=8, seed=4, logprobs=True, top_logprobs=3
    )
    [want] = local_answers(
        policy, encode_chat(policy.tokenizer, MESSAGES), max_tokens=8, seed=4, top_logprobs=3
    )
    [choice] = res.choices
    assert res.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == policy.tokenizer.decode(list(want.token_ids), skip_special_tokens=True)
    content = choice.logprobs.content
    assert [e.token for e in content] == [policy.tokenizer.decode([t]) for t in want.token_ids]
    assert [e.logprob for e in content] == pytest.approx(list(want.logprobs), abs=1e-4)
    for entry in content:  # a byte of a character decodes to nothing alone: its bytes still say which
        assert entry.bytes is None or bytes(entry.bytes).decode("utf-8", errors="ignore") == entry.token
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
    assert res.usage.prompt_tokens == len(encode_chat(policy.tokenizer, MESSAGES))


def test_chat_stream_sends_role_deltas_and_finish(sdk):
    policy, client = sdk
    kw = {"model": "random-tiny", "messages": MESSAGES, "max_completion_tokens": 10, "seed": 5, "n": 2}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, logprobs=True))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    for index, choice in enumerate(whole.choices):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert [c.finish_reason for c in mine][-1] == "length" and mine[-1].delta.content is None
        assert sum(len(c.logprobs.content) for c in mine if c.logprobs) == 10


@pytest.mark.parametrize(
    "endpoint, extra, param",
    [
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat", {"frequency_penalty": 0.5}, "frequency_penalty"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs=true
        ("chat", {"temperature": -1.0}, "temperature"),
        ("completions", {"suffix": "tail"}, "suffix"),
        ("completions", {"best_of": 3}, "best_of"),
        ("completions", {"echo": True, "stream": True}, "echo"),
        ("completions", {"logit_bias": {"5": 10}}, "logit_bias"),
    ],
)
def test_unserved_parameters_are_refused_by_name(sdk, endpoint, extra, param):
    _, client = sdk
    with pytest.raises(openai.BadRequestError) as err:
        if endpoint == "chat":
            client.chat.completions.create(model="random-tiny", messages=MESSAGES, max_tokens=2, **extra)
        else:
            client.completions.create(model="random-tiny", prompt="hi", max_tokens=2, **extra)
    assert err.value.status_code == 400
    error = err.value.body
    assert error["param"] == param and param in error["message"]
    assert error["type"] == "invalid_request_error"


def test_malformed_chat_messages_get_a_400_naming_the_field(sdk):
    _, client = sdk
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    for messages in (image, [], [{"role": "tool", "content": "x"}]):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="random-tiny", messages=messages, max_tokens=2)
        assert err.value.body["param"].startswith("messages")


class _BrokenPolicy:
    """A backend whose every generation fails."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = 64

    def generate(self, requests):
        raise RuntimeError("decode kernel crashed")


def test_backend_failure_answers_500_with_the_message(tiny_hf_policy):
    with BackgroundServer(create_app(_BrokenPolicy(tiny_hf_policy.tokenizer), "broken")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="decode kernel crashed"):
            client.chat.completions.create(model="broken", messages=MESSAGES, max_tokens=2, stream=True)
        client.close()


class _GatedPolicy:
    """The tiny policy whose streamed decode stops after step 3 until the test opens ``gate``."""

    def __init__(self, inner) -> None:
        self.inner, self.tokenizer, self.max_model_len = inner, inner.tokenizer, inner.max_model_len
        self.gate, self.steps = threading.Event(), 0

    def generate(self, requests):
        return self.inner.generate(requests)

    def stream(self):
        stream, wait = self.inner.stream(), None
        wait = stream.wait

        def gated_wait(on_step=None):
            def step() -> None:
                self.steps += 1
                on_step()
                if self.steps == 3:
                    self.gate.wait(timeout=20)

            return wait(on_step=step)

        stream.wait = gated_wait
        return stream


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_tokens_reach_the_client_while_the_model_still_decodes(tiny_hf_policy, endpoint):
    gated = _GatedPolicy(tiny_hf_policy)
    with BackgroundServer(create_app(gated, "gated")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        kw = {"model": "gated", "max_tokens": 20, "seed": 1, "stream": True, "logprobs": True}
        if endpoint == "chat":
            chunks = client.chat.completions.create(messages=MESSAGES, **kw)
        else:
            chunks = client.completions.create(prompt="Where does Ann live?", **{**kw, "logprobs": 0})
        first_at = None
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].logprobs and first_at is None:
                first_at = gated.steps  # the decode waits at step 3 until the client has seen a token
                gated.gate.set()
        client.close()
    assert first_at is not None and first_at <= 3
    assert gated.steps == 20


class _FailingStreamPolicy(_GatedPolicy):
    """Its streamed decode fails at step 3, after the first tokens went out."""

    def stream(self):
        stream = self.inner.stream()
        wait = stream.wait

        def failing_wait(on_step=None):
            def step() -> None:
                self.steps += 1
                if self.steps == 3:
                    raise RuntimeError("decode kernel crashed mid-stream")
                on_step()

            return wait(on_step=step)

        stream.wait = failing_wait
        return stream


def test_a_failure_mid_stream_reaches_the_client_as_an_error_event(tiny_hf_policy):
    with BackgroundServer(create_app(_FailingStreamPolicy(tiny_hf_policy), "failing")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        got = []
        with pytest.raises(openai.APIError, match="decode kernel crashed mid-stream"):
            for chunk in client.completions.create(model="failing", prompt="Ann", max_tokens=20, stream=True):
                got.append(chunk)
        client.close()
    assert got  # the tokens decoded before the failure were sent


def test_a_client_that_goes_away_stops_the_decode(tiny_hf_policy):
    gated = _GatedPolicy(tiny_hf_policy)
    with BackgroundServer(create_app(gated, "gated")) as srv:
        body = {"model": "gated", "prompt": "Ann", "max_tokens": 400, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body) as response:
            assert next(response.iter_lines()).startswith("data: {")
        # The client has hung up while the decode waits at step 3.
        gated.gate.set()
        deadline = time.monotonic() + 20
        while gated.steps < 400 and time.monotonic() < deadline:
            before = gated.steps
            time.sleep(0.5)
            if gated.steps == before:  # the decode has stopped
                break
    assert gated.steps < 400


def test_chat_without_a_chat_template_says_to_use_completions(tiny_hf_policy):
    from transformers import ByT5Tokenizer

    plain = _BrokenPolicy(ByT5Tokenizer())  # a base model's tokenizer: no chat template
    with BackgroundServer(create_app(plain, "base")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no chat template: use /v1/completions"):
            client.chat.completions.create(model="base", messages=MESSAGES, max_tokens=2)
        client.close()
