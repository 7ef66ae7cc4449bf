"""``memrl bench extract``: the scorer on real synthetic episodes, real MiniLM and FAISS; scripted replies stand in
for the policy (the bench itself runs SmolLM2; a slow test runs it on one episode)."""

from __future__ import annotations

import json
import os
import re

import pytest

from memrl.adapters.synthetic import make_episode, parse_statement
from memrl.bench import BENCHES
from memrl.bench.extract import run_extractor
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import build_embedder
from memrl.memory.write_scores import expected_decisions, holds
from memrl.types import MemoryOpType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Episode 1 of the test split asks an update question; with episode 0 (lookup) there are distractor updates too.
EPISODES = [make_episode(0, "test", i) for i in range(2)]
_MEMORY_LINE = re.compile(r"^(\d+)\. \[[^\]]*\] (.*)$", re.MULTILINE)
_MESSAGE = re.compile(r"^(?:New message|Message) \[[^\]]*\] [^:]*: (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(MemoryConfig())


def scripted(update_op: str):
    """Replies as a perfect extractor would, except that a changed value gets ``update_op`` ("UPDATE" or
    "DELETE") on the shown memory that holds the person's old value of that attribute."""

    def reply(prompt: str) -> str:
        parsed = parse_statement(_MESSAGE.search(prompt).group(1))
        if parsed is None:
            return '[{"op": "NOOP"}]'
        person, attr, value, _ = parsed
        text = _MESSAGE.search(prompt).group(1)
        for local, fact in _MEMORY_LINE.findall(prompt):
            # The shown memory about this person and attribute: the parsed statement of its text.
            old = parse_statement(fact)
            if old is not None and old[:2] == (person, attr) and old[2] != value:
                op = {"op": update_op, "id": int(local), "text": text}
                return json.dumps([op] if update_op == "UPDATE" else [op, {"op": "ADD", "text": text}])
        return json.dumps([{"op": "ADD", "text": text}])

    return lambda prompts: [reply(p) for p in prompts]


def test_expected_decisions_follow_the_values():
    truths = expected_decisions(EPISODES[1].history)
    updates = [t for t in truths if t.op is MemoryOpType.UPDATE]
    assert updates and all(t.stale and t.stale != t.value for t in updates)
    statements = [t for t in truths if t.person]
    assert {t.op for t in statements} <= {MemoryOpType.ADD, MemoryOpType.UPDATE}
    chitchat = [h for h, t in zip(EPISODES[1].history, truths, strict=True) if t.op is MemoryOpType.NOOP]
    assert chitchat and all(parse_statement(h.text) is None for h in chitchat)


def test_holds_needs_the_attribute_word_for_numbers():
    assert holds("Ann: Mia has 3 siblings.", "Mia", "siblings", "3")
    assert not holds("Mia has 3 pets.", "Mia", "siblings", "3")
    assert holds("Mia lives in Oslo now", "Mia", "city", "Oslo")
    assert not holds("Omar lives in Oslo.", "Mia", "city", "Oslo")


def test_rule_extractor_adds_every_statement_and_never_updates(embedder):
    result = run_extractor(EPISODES, MemoryConfig(extractor="rule"), embedder=embedder)
    assert result["turns"] == 36
    assert result["recall"]["ADD"] == 1.0
    assert result["recall"]["UPDATE"] == 0.0 and result["update_recall_right_target"] == 0.0
    assert result["chitchat_add_rate"] == 1.0  # every chit-chat turn becomes a fact
    assert result["confusion"]["UPDATE"] == {"ADD": result["expected"]["UPDATE"]}
    end = result["end_state"]
    assert end["update_questions"] == 1 and end["latest_present"] == 1.0 and end["stale_gone"] == 0.0
    assert result["delete_ops"] == 0 and result["malformed_replies"] == 0


def test_a_right_update_scores_full_target_accuracy(embedder):
    result = run_extractor(
        EPISODES, MemoryConfig(extractor="llm"), embedder=embedder, generate_text=scripted("UPDATE")
    )
    assert result["update_target_accuracy"] == 1.0 and result["update_recall_right_target"] == 1.0
    assert result["accuracy"] == 1.0 and result["chitchat_add_rate"] == 0.0
    assert result["end_state"]["correct"] == 1.0 and result["end_state"]["update_questions_correct"] == 1.0
    assert result["delete_ops"] == 0
    assert len(result["examples"]) == 6  # two raw replies per expected op


def test_a_delete_instead_of_an_update_is_a_wrong_delete(embedder):
    result = run_extractor(
        EPISODES, MemoryConfig(extractor="llm"), embedder=embedder, generate_text=scripted("DELETE")
    )
    n_updates = result["expected"]["UPDATE"]
    assert result["delete_ops"] == n_updates
    assert result["confusion"]["UPDATE"] == {"DELETE": n_updates}
    assert result["precision"]["DELETE"] == 0.0 and result["update_target_accuracy"] is None
    # Deleting the stale fact and adding the new one leaves the right end state, by the wrong op.
    assert result["end_state"]["correct"] == 1.0


def test_malformed_replies_are_counted_by_reason(embedder):
    replies = iter(["Sure! Here is the memory.", '[{"op": "UPDATE", "id": 7, "text": "x"}]'] * 100)
    result = run_extractor(
        EPISODES[:1],
        MemoryConfig(extractor="llm"),
        embedder=embedder,
        generate_text=lambda prompts: [next(replies) for _ in prompts],
    )
    assert result["malformed_replies"] == 18 and result["malformed_rate"] == 1.0
    assert result["malformed_by_reason"] == {"no_json": 9, "bad_id": 9}
    assert result["confusion"]["ADD"] == {"NOOP": result["expected"]["ADD"]}


def test_bench_runs_the_rule_extractor_from_argv():
    result = BENCHES.get("extract")(["--episodes", "2", "--extractor", "rule"])
    assert result["episodes"] == 2 and "llm" not in result
    assert result["rule"]["recall"]["ADD"] == 1.0 and result["rule"]["seconds_per_turn"] > 0
    with pytest.raises(SystemExit):
        BENCHES.get("extract")(["--episodes", "0"])


def test_bench_takes_the_writers_settings_from_a_run_config(tmp_path):
    from memrl.bench.extract import parse_args

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data: {options: {phrasing: varied}}\nepisode: {ingest_chunk_turns: 3}\n"
        "memory: {extractor: policy, write_neighbours: 4, update_target: nearest, update_min_cosine: 0.6}\n"
    )
    args = parse_args(["--config", str(cfg), "--extractor", "rule", "update_min_cosine=0.5"])
    assert (args.phrasing, args.chunk) == ("varied", 3)
    assert args.overrides["write_neighbours"] == 4 and args.overrides["update_target"] == "nearest"
    assert args.overrides["update_min_cosine"] == 0.5  # a key=value override wins over the file
    assert "extractor" not in args.overrides  # --extractor names it
    assert parse_args(["--config", str(cfg), "--chunk", "1"]).chunk == 1
    plain = parse_args([])
    assert (plain.phrasing, plain.chunk) == ("fixed", 1)
    cfg.write_text("memory: {topk: 3}\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(cfg)])


@pytest.mark.slow
def test_bench_with_smollm2_reports_tokens_per_turn():
    result = BENCHES.get("extract")(["--episodes", "1", "--extractor", "llm"])["llm"]
    assert result["turns"] == 18 and result["completion_tokens_per_turn"] > 0
    assert 0.0 <= result["malformed_rate"] <= 1.0


def test_a_perfect_policy_writer_scores_perfectly_on_varied_wordings_in_session_chunks(embedder):
    """The policy extractor's bench path (session writes, ops attributed to turns by line) against a scripted
    writer that replies with the gold operations: every decision right, no stale value among the current facts,
    every superseded value kept as history."""
    from memrl.memory.gold import gold_text
    from memrl.memory.llm import policy_text_generator
    from memrl.memory.store import FactRecord
    from memrl.testing.models import byte_tokenizer
    from memrl.testing.scripted import ScriptedPolicy

    episodes = [make_episode(0, "test", i, phrasing="varied") for i in range(3)]
    by_line = {f"[{t.timestamp}] {t.speaker}: {t.text}": t for ep in episodes for t in ep.history}

    def writer(ctx):
        user = ctx.text.rsplit("Memory:", 1)[-1]
        shown = [FactRecord(int(i), "ep", text) for i, text in _SHOWN.findall(user.split("New:")[0])]
        turns = [by_line[line] for line in user.split("New:")[1].split("Operations:")[0].strip().splitlines()]
        return gold_text(turns, shown)

    client = ScriptedPolicy(byte_tokenizer(), writer)
    cfg = MemoryConfig(extractor="policy", write_neighbours=8, write_max_tokens=400)
    got = run_extractor(
        episodes, cfg, embedder=embedder, generate_text=policy_text_generator(client), chunk=6
    )
    assert got["recall"] == {"ADD": 1.0, "UPDATE": 1.0, "DELETE": None, "NOOP": 1.0}
    assert got["update_recall_right_target"] == 1.0 and got["malformed_write_rate"] == 0.0
    assert got["writes"] == 9 and got["malformed_replies"] == 0
    end = got["end_state"]
    assert end["changed_keys"] > 0 and end["correct"] == 1.0 and end["stale_kept_as_history"] == 1.0


_SHOWN = re.compile(r"^(\d+)\. \[[^\]]*\] (.*)$", re.MULTILINE)


def test_wrong_decisions_are_kept_with_the_fact_they_replaced(embedder):
    def update_first_shown(prompt: str) -> str:
        text = _MESSAGE.search(prompt).group(1)
        shown = _MEMORY_LINE.findall(prompt)
        if parse_statement(text) is None:
            return '[{"op": "NOOP"}]'
        if shown:  # every statement replaces memory 0, whatever it holds
            return json.dumps([{"op": "UPDATE", "id": int(shown[0][0]), "text": text}])
        return json.dumps([{"op": "ADD", "text": text}])

    result = run_extractor(
        EPISODES,
        MemoryConfig(extractor="llm"),
        embedder=embedder,
        generate_text=lambda prompts: [update_first_shown(p) for p in prompts],
    )
    wrong_updates = [e for e in result["errors"] if e["expected"] == "ADD"]
    assert result["confusion"]["ADD"]["UPDATE"] >= len(wrong_updates) > 0
    assert len(wrong_updates) <= 5  # a few per (expected, decided) pair, not every turn
    for e in wrong_updates:
        assert e["decided"] == "UPDATE" and e["updated"][0] in e["memory"]
    assert all(e["expected"] != e["decided"] for e in result["errors"])  # a wrong target is named as such
    wrong_target = result["confusion"]["UPDATE"].get("UPDATE", 0) - round(
        result["update_recall_right_target"] * result["expected"]["UPDATE"]
    )
    kept = [e for e in result["errors"] if e["decided"] == "UPDATE of the wrong fact"]
    assert wrong_target > 0 and len(kept) == min(5, wrong_target)


def test_a_writer_that_invents_on_small_talk_is_caught_on_the_held_out_chats(embedder):
    """The policy path on two held-out chats, with a scripted writer that is right on every fact but writes
    "Diego is a musician." for every small-talk turn (what the synthetic recipe's writer did): the decisions
    show the false ADDs, and the invented rate is 1 on small talk, 0 on first statements and changes."""
    from memrl.data.adapters import run_adapter
    from memrl.memory.gold import gold_text
    from memrl.memory.llm import policy_text_generator
    from memrl.memory.store import FactRecord
    from memrl.testing.models import byte_tokenizer
    from memrl.testing.scripted import ScriptedPolicy

    per_question, _ = run_adapter("chats", None, split="test", options={"num_chats": 2})
    chats = list({ep.metadata["sample_id"]: ep for ep in per_question}.values())
    by_line = {f"[{t.timestamp}] {t.speaker}: {t.text}": t for ep in chats for t in ep.history}

    def writer(ctx):
        user = ctx.text.rsplit("Memory:", 1)[-1]
        shown = [FactRecord(int(i), "ep", text) for i, text in _SHOWN.findall(user.split("New:")[0])]
        turns = [by_line[line] for line in user.split("New:")[1].split("Operations:")[0].strip().splitlines()]
        if turns[0].metadata["turn_kind"] == "small_talk":
            return "ADD Diego is a musician."
        return gold_text(turns, shown)

    cfg = MemoryConfig(extractor="policy", write_neighbours=4, write_max_tokens=400)
    got = run_extractor(
        chats,
        cfg,
        embedder=embedder,
        generate_text=policy_text_generator(ScriptedPolicy(byte_tokenizer(), writer)),
    )
    faith = got["faithfulness"]["by_turn_kind"]
    assert faith["small_talk"]["invented_rate"] == 1.0 and faith["small_talk"]["writes"] == 2 * 48 - 2 * 11
    assert faith["first"]["invented_rate"] == 0.0 and faith["change"]["invented_rate"] == 0.0
    assert got["recall"]["NOOP"] == 0.0 and got["chitchat_add_rate"] == 1.0
    assert got["faithfulness"]["examples"][0]["invented"] == ["Diego is a musician."]


def test_bench_runs_on_the_held_out_chats_by_name():
    result = BENCHES.get("extract")(["--dataset", "chats", "--episodes", "2", "--extractor", "gold"])
    assert result["dataset"] == "chats" and result["episodes"] == 2 and result["history_turns"] == 96
    gold = result["gold"]
    assert gold["accuracy"] == 1.0 and gold["faithfulness"]["invented_rate"] == 0.0
    assert set(gold["faithfulness"]["by_turn_kind"]) == {"change", "first", "small_talk"}


def test_bench_runs_on_chats_of_novel_kinds_and_refuses_kinds_without_chats(capsys):
    result = BENCHES.get("extract")(["--dataset", "chats", "--kinds", "novel", "--episodes", "2", "--extractor",
                                     "gold"])  # fmt: skip
    assert result["kinds"] == "novel" and result["history_turns"] == 96
    assert result["gold"]["accuracy"] == 1.0 and result["gold"]["faithfulness"]["invented_rate"] == 0.0
    with pytest.raises(SystemExit):
        BENCHES.get("extract")(["--kinds", "novel", "--extractor", "gold"])
    assert "give --dataset chats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        BENCHES.get("extract")(["--dataset", "chats", "--kinds", "novel", "--split", "validation"])
    assert "--split test only" in capsys.readouterr().err
