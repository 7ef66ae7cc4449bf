from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.data.config import DataConfig
from memrl.data.datasource import DataSourceStateError, RolloutDataSource
from memrl.types import BatchInput, TurnSpec


def make_inputs(n: int, prefix: str = "ep") -> list[BatchInput]:
    return [
        BatchInput(
            episode_id=f"{prefix}{i}",
            group_id=f"{prefix}{i}",
            turns=(
                TurnSpec(role="history", text=f"fact {i}", turn_id=f"h{i}"),
                TurnSpec(role="target", text=f"question {i}?", turn_id=f"t{i}"),
            ),
            final_query=f"question {i}?",
            target_answer=str(i),
            metadata={"k": i},
        )
        for i in range(n)
    ]


def stream_key(groups: list[list[BatchInput]]) -> list[tuple[str, str, int]]:
    return [(x.episode_id, x.group_id, x.sample_index) for g in groups for x in g]


def test_groups_copy_one_prompt_with_unique_indices_and_shared_group_id():
    inputs = make_inputs(5)
    source = RolloutDataSource(inputs, n_samples_per_prompt=3, shuffle=False)
    groups = source.get_samples(2) + source.get_samples(1)
    assert [len(g) for g in groups] == [3, 3, 3]
    indices = [x.sample_index for g in groups for x in g]
    assert indices == list(range(9))
    for g, original in zip(groups, inputs[:3], strict=True):
        assert {x.group_id for x in g} == {f"{original.episode_id}@e0"}
        # Copies are separate episodes: distinct ids (the runner runs each id once per batch).
        assert [x.episode_id for x in g] == [f"{original.episode_id}~{k}" for k in range(3)]
        for x in g:  # everything but the group/sample ids is the original prompt
            assert (x.turns, x.final_query, x.target_answer, x.metadata) == (
                original.turns,
                original.final_query,
                original.target_answer,
                original.metadata,
            )
    assert inputs[0].sample_index == -1  # the dataset itself is untouched


def test_wraps_into_the_next_epoch_sequentially():
    source = RolloutDataSource(make_inputs(3), n_samples_per_prompt=1, shuffle=False)
    groups = source.get_samples(5)
    assert [g[0].group_id for g in groups] == ["ep0@e0", "ep1@e0", "ep2@e0", "ep0@e1", "ep1@e1"]
    assert (source.epoch, source.offset, source.sample_index) == (1, 2, 5)
    assert len({g[0].group_id for g in groups}) == 5  # group ids unique per draw


def test_shuffle_is_a_seeded_permutation_per_epoch():
    inputs = make_inputs(20)
    a = RolloutDataSource(inputs, shuffle=True, seed=7)
    b = RolloutDataSource(inputs, shuffle=True, seed=7)
    c = RolloutDataSource(inputs, shuffle=True, seed=8)
    ea = [g[0].episode_id for g in a.get_samples(40)]
    assert ea == [g[0].episode_id for g in b.get_samples(40)]
    assert ea != [g[0].episode_id for g in c.get_samples(40)]
    assert sorted(ea[:20]) == sorted(x.episode_id for x in inputs)  # each epoch: all, once
    assert sorted(ea[20:]) == sorted(ea[:20])
    assert ea[:20] != ea[20:]  # a fresh order every epoch
    assert ea[:20] != [x.episode_id for x in inputs]


def test_rejects_bad_datasets():
    with pytest.raises(ValueError, match="empty"):
        RolloutDataSource([])
    with pytest.raises(ValueError, match="ep1.*items 1 and 2"):
        RolloutDataSource(make_inputs(2) + make_inputs(2)[1:])
    with pytest.raises(TypeError, match="item 0"):
        RolloutDataSource([{"episode_id": "x"}])


def test_from_config_uses_sampling_settings():
    cfg = DataConfig(n_samples_per_prompt=2, shuffle=False, seed=3)
    source = RolloutDataSource.from_config(cfg, make_inputs(4))
    assert (source.n_samples_per_prompt, source.shuffle, source.seed) == (2, False, 3)
    assert len(source.get_samples(1)[0]) == 2


def test_save_is_atomic_and_load_refuses_other_datasets(tmp_path: Path):
    source = RolloutDataSource(make_inputs(4), n_samples_per_prompt=2)
    source.get_samples(3)
    path = tmp_path / "state" / "ds.json"
    source.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["ds.json"]  # no temp file left behind
    assert json.loads(path.read_text())["sample_index"] == 6

    other = RolloutDataSource(make_inputs(4, prefix="other"), n_samples_per_prompt=2)
    with pytest.raises(DataSourceStateError, match="dataset_fingerprint"):
        other.load(path)
    wrong_n = RolloutDataSource(make_inputs(4), n_samples_per_prompt=3)
    with pytest.raises(DataSourceStateError, match="n_samples_per_prompt"):
        wrong_n.load(path)
    path.write_text("{not json")
    with pytest.raises(DataSourceStateError, match="ds.json"):
        source.load(path)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 9),
    n=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 3),
    chunks=st.lists(st.integers(0, 7), min_size=1, max_size=8),
    stops=st.sets(st.integers(0, 7)),
)
def test_resume_at_random_stop_points_neither_loses_nor_repeats(size, n, shuffle, seed, chunks, stops):
    inputs = make_inputs(size)
    reference = RolloutDataSource(inputs, n_samples_per_prompt=n, shuffle=shuffle, seed=seed)
    expected = [reference.get_samples(c) for c in chunks]

    with tempfile.TemporaryDirectory() as tmp:
        source = RolloutDataSource(inputs, n_samples_per_prompt=n, shuffle=shuffle, seed=seed)
        got = []
        for k, c in enumerate(chunks):
            if k in stops:  # "crash" here: a brand-new process resumes from the file
                source.save(Path(tmp) / "ds.json")
                source = RolloutDataSource(inputs, n_samples_per_prompt=n, shuffle=shuffle, seed=seed)
                source.load(Path(tmp) / "ds.json")
            got.append(source.get_samples(c))
    assert stream_key([g for part in got for g in part]) == stream_key([g for part in expected for g in part])
    flat = stream_key([g for part in got for g in part])
    assert len({idx for _, _, idx in flat}) == len(flat)  # sample indices never repeat
