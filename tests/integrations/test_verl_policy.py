"""VerlServerPolicy (memrl PolicyClient over verl's async server client) and the verl dataset rows; no verl
needed. A scripted policy behind a stand-in server client writes a broken tool call, a fixed one and an answer,
so the real sandbox, rollback and reward run through the adapter."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pandas as pd
import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.integrations.verl import (
    INPUT_KEY,
    VerlDataError,
    episode_input,
    select_leaves,
    verl_dataset_rows,
)
from memrl.integrations.verl_policy import VerlServerPolicy
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.errors import PolicyError
from memrl.rollout import RolloutConfig, RolloutRequest, TreeConfig, run_rollout
from memrl.testing.scripted import ScriptedPolicy, ScriptedTurn
from memrl.types import EpisodeStatus
from tests.integrations.verl_standins import PolicyServerClient, rollback_script


@pytest.fixture
def loop():
    """An event loop on a background thread, as verl's agent-loop worker runs one."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


@pytest.fixture(scope="module")
def cfg():
    return load_config(
        None,
        [
            "data.adapter=synthetic",
            "data.options={num_episodes: 2}",
            "tools.enabled=[python]",
            "rollout.n=2",
            "rollout.max_response_tokens=200",
            "rollout.rollback.enable_tool_rollback=true",
            "episode.reward=composite",
            "episode.reward_options={parts: {exact_match: 1.0, format: 0.5}}",
        ],
    )


def _run(cfg, policy):
    runner = build_runner(cfg, policy=policy)
    inputs, _ = load_dataset(cfg.data)
    try:
        return runner.run_batch(inputs)
    finally:
        runner.tools.close()


def test_episodes_through_the_adapter_equal_the_direct_policy(cfg, loop):
    tok = ByT5Tokenizer()
    direct = _run(cfg, ScriptedPolicy(tok, rollback_script))
    server = PolicyServerClient(ScriptedPolicy(tok, rollback_script))
    adapter = VerlServerPolicy(server, tok, loop)
    adapter.set_sampling({"temperature": 0.7, "top_p": 0.9, "top_k": -1, "logprobs": False, "junk": 1})
    via = _run(cfg, adapter)
    assert [t.status for t in via] == [EpisodeStatus.COMPLETED] * len(direct)
    for a, b in zip(direct, via, strict=True):
        sa, sb = a.steps[-1], b.steps[-1]
        assert (sb.prompt_ids, sb.response_ids, sb.response_mask) == (
            sa.prompt_ids,
            sa.response_ids,
            sa.response_mask,
        )
        assert sb.logprobs == sa.logprobs and b.reward == a.reward
        assert 0 in sb.response_mask and len(sb.meta.rollbacks) == 1  # tool result masked, rollback recorded
    # verl's sampling keys pass through, memrl's per-request ones are added, logprobs are always asked for
    params = server.calls[0][1]
    assert params["temperature"] == 0.7 and params["top_k"] == -1 and "junk" not in params
    assert params["logprobs"] is True and params["max_tokens"] >= 1 and params["include_stop_str_in_output"]


def test_finish_reasons_and_errors(loop):
    tok = ByT5Tokenizer()
    adapter = VerlServerPolicy(PolicyServerClient(ScriptedPolicy(tok, lambda ctx: "abcdef")), tok, loop)
    req = GenerationRequest(
        tuple(tok.encode("hi", add_special_tokens=False)), SamplingParams(max_tokens=3, n=2)
    )
    outs = adapter.generate([req])[0]
    assert len(outs) == 2 and all(o.finish_reason.value == "length" and len(o.token_ids) == 3 for o in outs)
    stop = GenerationRequest(req.prompt_ids, SamplingParams(max_tokens=20, stop=("cd",)))
    out = adapter.generate([stop])[0][0]
    assert tok.decode(list(out.token_ids)) == "abcd" and out.stop_reason == "cd"
    with pytest.raises(PolicyError, match="actor computes"):
        adapter.logprobs([((1,), (2,))])

    class NoLogprobs(PolicyServerClient):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            out.log_probs = None
            return out

    # the weight versions the outputs were sampled under: none reported by this server, then steps 3 and 5
    assert adapter.take_weight_versions() == (None, None)

    class Versioned(PolicyServerClient):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            out.extra_fields = {"min_global_steps": 3, "max_global_steps": 5}
            return out

    versioned = VerlServerPolicy(Versioned(ScriptedPolicy(tok, lambda ctx: "x")), tok, loop)
    versioned.generate([req])
    assert versioned.take_weight_versions() == (3, 5) and versioned.take_weight_versions() == (None, None)

    bare = VerlServerPolicy(NoLogprobs(ScriptedPolicy(tok, lambda ctx: "x")), tok, loop)
    with pytest.raises(PolicyError, match="no per-token log-probs"):
        bare.generate([req])


def test_entropy_forks_over_verl_servers_land_where_the_sampled_token_was_unlikely(loop):
    """verl's servers return only the sampled token's log-prob: nodes are ranked by its surprisal instead."""
    tok = ByT5Tokenizer()
    hot = range(8, 12)  # the 4 tokens after the node at response position 8 were unlikely samples

    def script(ctx):
        start = len(ctx.text.split("A:", 1)[1])
        text = "abcdefghijklmnop"[start:] or "z"
        return ScriptedTurn(
            text=text, logprobs=tuple(-3.0 if start + i in hot else -0.02 for i in range(len(text) + 1))
        )

    server = PolicyServerClient(ScriptedPolicy(tok, script))
    adapter = VerlServerPolicy(server, tok, loop)
    tree = TreeConfig(
        initial_rollouts=1, expansion_iterations=1, beam_size=3, expansion_policy="entropy", segment_tokens=4
    )
    cfg = RolloutConfig(strategy="tree", n=3, tree=tree, max_response_tokens=32)
    prompt = tuple(tok.encode("Q: letters?\nA:", add_special_tokens=False))
    [leaves] = run_rollout([RolloutRequest(prompt, "ep")], adapter, None, cfg).leaves
    forks = [s for s in leaves if s.meta.branch_depth == 1]
    # [root, 4, 8, ...]: both forks leave the initial chain at its node 8
    assert len(forks) == 2 and all([p.pos for p in s.meta.tree_path[:3]] == [0, 4, 8] for s in forks)
    assert all("top_logprobs" not in params for _, params in server.calls)  # only the sampled log-prob asked


def test_dataset_rows_survive_parquet(tmp_path, cfg):
    inputs, _ = load_dataset(cfg.data)
    # empty metadata dicts everywhere: pyarrow cannot write a struct with no fields, the JSON column can
    inputs = [dataclasses.replace(inp, metadata={}) for inp in inputs]
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_dataset_rows(inputs)).to_parquet(path)
    back = pd.read_parquet(path)
    assert list(back["agent_name"]) == ["memrl"] * len(inputs)
    for i, inp in enumerate(inputs):
        assert episode_input(back["extra_info"][i]) == inp
        assert back["extra_info"][i]["index"] == i


def test_bad_rows_and_missing_leaves_are_clear(cfg):
    with pytest.raises(VerlDataError, match=INPUT_KEY):
        episode_input({"index": 0}, sample="uid=7")
    with pytest.raises(VerlDataError, match="not JSON"):
        episode_input({INPUT_KEY: "{oops"})
    inputs, _ = load_dataset(cfg.data)
    leaves = select_leaves(inputs[0], [], 3)
    assert [leaf.status for leaf in leaves] == [EpisodeStatus.FAILED] * 3
    assert all(leaf.steps[0].response_mask == (0,) and leaf.reward == 0.0 for leaf in leaves)
