from __future__ import annotations

import math

import pytest

from memrl.rollout import RolloutConfig, RolloutRequest, TreeConfig, run_rollout
from memrl.testing.scripted import ScriptedPolicy, ScriptedTurn, random_script
from tests.rollout.rollout_fixtures import PROMPT, encode


def _cfg(n, init, iters, nodes, beam, seg=6, **kw):
    tree = TreeConfig(
        initial_rollouts=init,
        expansion_iterations=iters,
        nodes_per_expansion=nodes,
        beam_size=beam,
        segment_tokens=seg,
        expansion_policy=kw.pop("policy", "random"),
    )
    return RolloutConfig(strategy="tree", n=n, tree=tree, max_response_tokens=kw.pop("max_tokens", 200), **kw)


def _requests(tok, k):
    return [RolloutRequest(encode(tok, f"#{i} {PROMPT}"), f"ep{i}") for i in range(k)]


@pytest.mark.parametrize(
    "shape",
    [(4, 2, 1, 1, 3), (16, 4, 3, 2, 3), (6, 1, 1, 1, 2), (5, 2, 2, 2, 2), (3, 1, 0, 1, 2)],
)
def test_tree_shape_and_leaf_count(tok, shape):
    n, init, iters, nodes, beam = shape
    cfg = _cfg(n, init, iters, nodes, beam)
    pol = ScriptedPolicy(tok, random_script(min_tokens=20, max_tokens=40))
    result = run_rollout(_requests(tok, 3), pol, None, cfg)
    built = init + iters * nodes * (beam - 1)
    assert cfg.tree.leaves_per_tree() == built
    assert result.metrics["rollout/tree/leaves"] == 3 * built
    for leaves in result.leaves:
        assert len(leaves) == n
        dups = [s for s in leaves if s.meta.is_duplicate]
        assert len(dups) == max(0, n - built)
        originals = [s for s in leaves if not s.meta.is_duplicate]
        assert len({s.meta.node_path for s in originals}) == len(originals)  # distinct tree positions
        assert len({s.response_ids for s in originals}) == len(originals)
        assert {s.meta.tree_id for s in leaves} == {leaves[0].meta.tree_id}
        assert max(s.meta.branch_depth for s in leaves) <= iters
        for s in leaves:
            assert set(s.response_mask) == {1} and s.logprobs == tuple(s.logprobs)


def test_branches_share_their_parent_prefix_and_reuse_it(tok):
    cfg = _cfg(8, 2, 3, 1, 3, seg=5)
    pol = ScriptedPolicy(tok, random_script(min_tokens=25, max_tokens=30))
    [leaves] = run_rollout(_requests(tok, 1), pol, None, cfg).leaves
    by_path = {s.meta.node_path: s for s in leaves}
    for path, step in by_path.items():
        for other_path, other in by_path.items():
            common = 0
            while common < min(len(path), len(other_path)) and path[common] == other_path[common]:
                common += 1
            if other is not step and common >= 2:
                # Same first node => identical first segment (5 tokens), copied, never regenerated.
                assert step.response_ids[:5] == other.response_ids[:5]
    # Every fork continued from a cached prefix: the prompt itself once, and each of the 3 fork requests only its
    # last token (its logits); nothing else recomputed.
    prompt_len = len(leaves[0].prompt_ids)
    assert pol.stats.prefill_tokens == prompt_len + 3
    assert pol.stats.cached_tokens > 0


def test_one_generate_call_per_iteration_across_requests(tok):
    def fixed(ctx):  # every leaf is 16 tokens + eos, wherever it forked
        return "x" * (16 - len(ctx.text.split("A:", 1)[1]))

    calls = []
    for k in (1, 4):
        pol = ScriptedPolicy(tok, fixed)
        # One chain, nodes at 4, 8, 12, 16 - all four expanded, so the work per tree is deterministic.
        result = run_rollout(_requests(tok, k), pol, None, _cfg(9, 1, 1, 4, 3, seg=4))
        assert result.metrics["rollout/tree/leaves"] == 9 * k
        calls.append(pol.stats.generate_calls)
        # Phase 2: one chain per tree, run to its stop in one call (its segment nodes are laid afterwards);
        # the expansion round: 4 requests per tree (one per node, n=2), again one call.
        assert pol.stats.batch_sizes == [k, 4 * k]
        # Forks continue from the chain's cached final state (cropped to the node): the prompts are computed once
        # (but the "#" the later ones share with the first), each of the 4k fork requests only its last token.
        prompts = sum(len(r.prompt_ids) for r in _requests(tok, k))
        assert pol.stats.prefill_tokens == prompts - (k - 1) + 4 * k
    # One call per phase, whatever the request count.
    assert calls == [2, 2]


def test_n_smaller_than_tree_samples_distinct_leaves(tok):
    cfg = _cfg(3, 4, 2, 2, 3)
    pol = ScriptedPolicy(tok, random_script(min_tokens=20, max_tokens=40))
    result = run_rollout(_requests(tok, 2), pol, None, cfg)
    for leaves in result.leaves:
        assert len(leaves) == 3 and not any(s.meta.is_duplicate for s in leaves)
        assert len({s.meta.node_path for s in leaves}) == 3


def _peaked(k=5):
    return {1000 + j: (math.log(0.96) if j == 0 else math.log(0.01)) for j in range(k)}


def _flat(k=5):
    return {1000 + j: math.log(1 / k) for j in range(k)}


def test_entropy_policy_branches_where_the_model_is_uncertain(tok):
    seg, hot = 4, 12  # tokens 12..15 follow the node at response position 12 and are uncertain

    def script(ctx):
        start = len(ctx.text.split("A:", 1)[1])
        text = "y" * max(1, 24 - start)
        tops = tuple(_flat() if hot <= start + i < hot + seg else _peaked() for i in range(len(text) + 1))
        return ScriptedTurn(text=text, logprobs=(math.log(0.96),) * (len(text) + 1), top_logprobs=tops)

    cfg = _cfg(3, 1, 1, 1, 3, seg=seg, policy="entropy")
    pol = ScriptedPolicy(tok, script)
    [leaves] = run_rollout(_requests(tok, 1), pol, None, cfg).leaves
    forks = [s for s in leaves if s.meta.branch_depth == 1]
    assert len(forks) == 2
    # The initial chain's nodes sit at 4, 8, 12, 16, 20; the one at 12 is third on the path (index 2).
    for s in forks:
        assert s.meta.node_path[:3] == (0, 0, 0) and s.meta.node_path[3] in (1, 2)
    chain = next(s for s in leaves if s.meta.branch_depth == 0)
    assert len(chain.meta.node_path) > 4 and chain.meta.node_path[3] == 0


def test_unknown_expansion_policy_lists_choices(tok):
    cfg = _cfg(4, 2, 1, 1, 3, policy="best")
    pol = ScriptedPolicy(tok, random_script())
    with pytest.raises(KeyError, match="entropy, random"):
        run_rollout(_requests(tok, 1), pol, None, cfg)


def _sampled_only_script(hot: range, length: int = 24):
    """Writes ``length`` tokens with only sampled log-probs (top-k is never given): likely tokens everywhere
    except at response positions ``hot``, where the sampled token was unlikely."""

    def script(ctx):
        start = len(ctx.text.split("A:", 1)[1])
        text = "abcdefghijklmnopqrstuvwx"[start:length] or "z"
        lps = tuple(math.log(0.05 if start + i in hot else 0.97) for i in range(len(text) + 1))
        return ScriptedTurn(text=text, logprobs=lps)

    return script


def test_without_top_k_segment_forks_land_after_the_low_logprob_window(tok):
    seg, hot = 4, 12  # tokens 12..15 follow the node at response position 12 and were unlikely samples
    for trial in range(3):  # with no signal, ties would break at random: the pick must not depend on it
        cfg = _cfg(3, 1, 1, 1, 3, seg=seg, policy="entropy", top_logprobs=0, seed=trial)
        pol = ScriptedPolicy(tok, _sampled_only_script(range(hot, hot + seg)))
        [leaves] = run_rollout(_requests(tok, 1), pol, None, cfg).leaves
        forks = [s for s in leaves if s.meta.branch_depth == 1]
        # [root, 4, 8, 12, ...]: both forks leave the initial chain at its node 12
        assert len(forks) == 2 and all([p.pos for p in s.meta.tree_path[:4]] == [0, 4, 8, hot] for s in forks)


def test_segment_nodes_never_sit_inside_tool_output_and_restart_after_it(tok):
    from tests.rollout.rollout_fixtures import TableTools

    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        if "<result>" not in resp:
            return "<python>print(12345678)</python>"[len(resp) :]
        return "<answer>12345678</answer>"[len(resp) - resp.rfind("</result>") - len("</result>") :]

    cfg = _cfg(12, 1, 4, 2, 2, seg=6)
    [leaves] = run_rollout(_requests(tok, 1), ScriptedPolicy(tok, script), TableTools(), cfg).leaves
    assert len({s.meta.node_path for s in leaves}) == 9  # 1 chain + 4 rounds x 2 forks
    chain = next(s for s in leaves if s.meta.branch_depth == 0)
    result = [i for i, m in enumerate(chain.response_mask) if m == 0]
    after = result[-1] + 1  # the answer turn starts here
    # Every 6 model tokens of each turn, and at the answer turn's start: the tool result ends a segment.
    call_nodes, answer_nodes = list(range(6, result[0], 6)), list(range(after, len(chain.response_ids), 6))
    assert [p.pos for p in chain.meta.tree_path[1:-1]] == call_nodes + answer_nodes
    nodes = {(p.uid, p.pos, s.response_mask[p.pos]) for s in leaves for p in s.meta.tree_path[1:-1]}
    assert len({pos for _, pos, _ in nodes}) >= 3
    assert {m for _, _, m in nodes} == {1}  # the result tokens (mask 0) are never resampled


def test_every_tree_keeps_its_initial_chains_and_exactly_n_leaves(tok):
    """Prompt #1's first chains answer differently, prompt #0's agree: both trees keep ``initial_rollouts``
    chains, grow the same number of branches and return exactly n leaves."""

    def script(ctx):
        if "A:" in ctx.text and ctx.text.split("A:", 1)[1]:
            return ""  # a fork continues a finished chain: nothing more to say
        agree = ctx.text.startswith("#0")
        return f"thinking it over <answer>{7 if agree else ctx.sample_index + (ctx.seed or 0)}</answer>"

    result = run_rollout(_requests(tok, 2), ScriptedPolicy(tok, script), None, _cfg(8, 2, 2, 1, 4, seg=4))
    assert [sum(1 for s in x if s.meta.branch_depth == 0) for x in result.leaves] == [2, 2]
    assert result.metrics["rollout/tree/leaves"] == 2 * 8
    for leaves in result.leaves:
        assert len(leaves) == 8 and not any(s.meta.is_duplicate for s in leaves)


def _calling_script(head: str):
    """Writes ``head`` (ending in ``<python>``), a program printing a number drawn from its seed, then answers with
    the result; a branch forked right after the opening tag writes only the program."""
    import random
    import re

    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        if "</result>" in resp:
            return f"<answer>{re.findall(r'<result>(.*?)</result>', resp)[-1]}</answer>"
        k = random.Random(f"{ctx.seed}/{ctx.sample_index}").randrange(100, 1000)
        return f"print({k})</python>" if resp.endswith("<python>") else f"{head}print({k})</python>"

    return script


@pytest.mark.parametrize("policy", ["tool_call", "random"])
def test_tool_call_policy_forks_right_after_the_calls_opening_tag(tok, policy):
    from tests.rollout.rollout_fixtures import TableTools

    head = " I compute it. <python>"
    cfg = _cfg(6, 2, 2, 1, 3, seg=6, policy=policy)
    leaves = run_rollout(
        _requests(tok, 2), ScriptedPolicy(tok, _calling_script(head)), TableTools(), cfg
    ).leaves
    steps = [s for tree in leaves for s in tree]
    fork_points = {p.pos for s in steps for p in s.meta.tree_path[1:] if p.children > 1}  # not the root
    assert sum(s.meta.branch_depth > 0 for s in steps) == 8  # 2 trees x 2 rounds x 2 new branches
    if policy == "random":  # forks land elsewhere too (and this script cannot finish a program cut mid-way)
        assert fork_points - {len(head.encode())}
        return
    assert fork_points == {len(head.encode())}  # right after "<python>"
    for tree in leaves:
        for s in tree:
            assert tok.decode(list(s.response_ids)).startswith(head) and s.meta.tool_calls[0].status == "ok"
        # Forks resample the program: every leaf of a tree computed its own number.
        assert len({s.meta.tool_calls[0].result for s in tree}) == len(tree)


def test_tool_call_policy_forks_at_random_nodes_in_a_tree_without_calls(tok):
    cfg = _cfg(4, 2, 1, 1, 3, policy="tool_call")
    [leaves] = run_rollout(
        _requests(tok, 1), ScriptedPolicy(tok, random_script(min_tokens=20)), None, cfg
    ).leaves
    assert sum(s.meta.branch_depth > 0 for s in leaves) == 2 and all(not s.meta.tool_calls for s in leaves)
