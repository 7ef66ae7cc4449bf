from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.train.checkpoint import (
    TMP_PREFIX,
    TrainState,
    clean_stale,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from memrl.train.config import LoraConfig, TrainConfig
from memrl.train.lora import adapter_state, attach_lora
from memrl.train.updater import PolicyUpdater
from tests.train.train_fixtures import make_episodes, tiny_llama

CFG = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8))


def _batch(seed):
    return TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(make_episodes(seed=seed))


def _fresh():
    model = attach_lora(tiny_llama(), CFG.lora)
    return model, PolicyUpdater(model, CFG)


def test_adapter_is_standard_peft_and_reloads(tmp_path):
    model, upd = _fresh()
    upd.update(_batch(0))
    path = save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=1))
    reloaded = PeftModel.from_pretrained(tiny_llama(), str(path / "adapter")).eval()
    ids = torch.randint(3, 300, (1, 20))
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits, atol=1e-6)
        with model.disable_adapter():
            base = model(ids).logits
    assert not torch.allclose(base, reloaded(ids).logits, atol=1e-6)  # the adapter is not a no-op


def test_resume_continues_exactly(tmp_path):
    model, upd = _fresh()
    upd.update(_batch(0))
    save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=1, data_source={"offset": 3}))
    upd.update(_batch(1))
    straight = adapter_state(model)

    model2, upd2 = _fresh()
    state = load_checkpoint(latest_checkpoint(tmp_path), model2, upd2.optimizer)
    assert state.step == 1 and state.data_source == {"offset": 3}
    upd2.update(_batch(1))
    resumed = adapter_state(model2)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_rng_state_is_restored(tmp_path):
    model, upd = _fresh()
    torch.manual_seed(123)
    save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=1))
    expected = torch.rand(3)
    torch.manual_seed(999)
    load_checkpoint(latest_checkpoint(tmp_path), model, upd.optimizer)
    assert torch.equal(torch.rand(3), expected)


def test_incomplete_checkpoints_are_ignored_and_cleaned(tmp_path):
    model, upd = _fresh()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=step), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000003"]
    # what a SIGKILL in the middle of writing step 4 leaves behind
    torn = tmp_path / f"{TMP_PREFIX}step_000004-999"
    (torn / "adapter").mkdir(parents=True)
    (torn / "state.json").write_text(json.dumps({"step": 4}))
    assert latest_checkpoint(tmp_path).name == "step_000003"
    assert clean_stale(tmp_path) == 1 and not torn.exists()


def _assert_intact(root, step):
    """Only the earlier checkpoint is there, no temp directory, and it loads."""
    name = f"step_{step:06d}"
    assert [p.name for p in root.iterdir() if p.name.startswith(("step_", TMP_PREFIX))] == [name]
    assert latest_checkpoint(root).name == name
    model, upd = _fresh()
    assert load_checkpoint(latest_checkpoint(root), model, upd.optimizer).step == step


@pytest.mark.parametrize(
    "room",
    [0, 48 * 1024],  # nothing fits; the adapter (~32 kB of pages) fits and torch's optimizer.pt write fails
)
def test_a_full_disk_while_saving_names_the_checkpoint_and_keeps_the_previous_one(small_tmpfs, room):
    """A real full filesystem (tmpfs): one DiskFullError naming the checkpoint; step 1 intact, nothing torn."""
    from memrl.disk import DiskFullError
    from tests.conftest import fill_disk

    root = small_tmpfs / "checkpoints"
    model, upd = _fresh()
    upd.update(_batch(0))
    save_checkpoint(root, model, upd.optimizer, TrainState(step=1))
    upd.update(_batch(1))
    fill_disk(small_tmpfs, keep=room)
    with pytest.raises(DiskFullError) as info:
        save_checkpoint(root, model, upd.optimizer, TrainState(step=2))
    message = str(info.value)
    assert str(root / "step_000002") in message and "needs ~" in message and "resume" in message
    (small_tmpfs / "filler").unlink()
    _assert_intact(root, 1)


def test_torch_s_unexpected_pos_on_a_full_disk_is_a_disk_full_error(tmp_path, monkeypatch):
    """torch's zip writer reports ENOSPC as "unexpected pos": the space left where it wrote says why."""
    from memrl import disk
    from memrl.disk import DiskFullError

    model, upd = _fresh()
    save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=1))
    real_save = torch.save

    def save_until_full(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        with open(path, "r+b") as fh:
            fh.truncate(100)  # the part that fitted
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1088 vs 1034")

    monkeypatch.setattr(torch, "save", save_until_full)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 0)
    expected = r"to write a checkpoint into .*step_000002: needs ~\S+ \w+, 0 B free"
    with pytest.raises(DiskFullError, match=expected):
        save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=2))
    monkeypatch.setattr(torch, "save", real_save)
    _assert_intact(tmp_path, 1)

    # With space left, the same error is not a full disk and is re-raised as it is (no temp dir left either).
    monkeypatch.setattr(torch, "save", save_until_full)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10**12)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        save_checkpoint(tmp_path, model, upd.optimizer, TrainState(step=2))
    monkeypatch.setattr(torch, "save", real_save)
    _assert_intact(tmp_path, 1)
