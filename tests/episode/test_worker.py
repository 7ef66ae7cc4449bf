"""CustomRolloutWorker: local order/completeness, and Ray actors where a killed actor's shard is re-run."""

from __future__ import annotations

import time

import pytest

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.worker import CustomRolloutWorker, LocalRolloutWorker, WorkerLostError, check_complete
from memrl.types import EpisodeStatus, EpisodeTrajectory


def _cfg(model_dir: str, *extra: str):
    return load_config(
        None,
        [
            f"policy.model={model_dir}",
            "data.adapter=synthetic",
            "data.options={num_episodes: 6}",
            "tools.enabled=[]",
            "rollout.n=1",
            "rollout.max_response_tokens=8",
            "episode.batch_size=2",
            "episode.record_history_turns=false",
            *extra,
        ],
    )


def _traj(eid: str) -> EpisodeTrajectory:
    return EpisodeTrajectory(eid, eid, (), 0.0, EpisodeStatus.FAILED, failure_reason="x")


def test_check_complete_flags_lost_duplicated_and_reordered(tiny_llama_dir):
    inputs, _ = load_dataset(_cfg(tiny_llama_dir).data)
    ids = [bi.episode_id for bi in inputs[:3]]
    check_complete(inputs[:3], [_traj(i) for i in ids])
    with pytest.raises(WorkerLostError, match="missing"):
        check_complete(inputs[:3], [_traj(i) for i in ids[:2]])
    with pytest.raises(WorkerLostError):
        check_complete(inputs[:3], [_traj(i) for i in reversed(ids)])


def test_local_worker_chunks_keep_input_order(tiny_llama_dir):
    cfg = _cfg(tiny_llama_dir)
    inputs, _ = load_dataset(cfg.data)
    worker = CustomRolloutWorker(cfg)
    assert isinstance(worker, LocalRolloutWorker)
    trajs = worker.run_batch(inputs[:3])  # batch_size 2 → chunks of 2 and 1
    assert [t.episode_id for t in trajs] == [bi.episode_id for bi in inputs[:3]]
    assert worker.metrics()["episode/time_generate_s"] > 0
    worker.close()


@pytest.mark.slow  # ~90 s here: starts Ray and three actors that each load torch, MiniLM and the model
def test_ray_actor_killed_mid_batch_loses_nothing(tiny_llama_dir, ray_local):
    ray = ray_local
    cfg = _cfg(
        tiny_llama_dir,
        "episode.worker.use_ray=true",
        "episode.worker.num_workers=2",
        "episode.worker.num_cpus_per_worker=0.5",
    )
    inputs, _ = load_dataset(cfg.data)
    worker = CustomRolloutWorker(cfg)
    # Actor calls run in order, so ask for the pid (= wait until the actor is up) before submitting.
    victim_pid = ray.get(worker.actors[0].pid.remote())
    pending = worker.submit(inputs)
    assert len(pending.shards) == 3  # 6 episodes, batch_size 2; actor 0 holds shards 0 and 2
    time.sleep(1.0)  # shard 0 is now running (an episode batch takes seconds here)
    ray.kill(worker.actors[0], no_restart=True)
    trajs = worker.gather(pending)
    assert [t.episode_id for t in trajs] == [bi.episode_id for bi in inputs]  # input order, no loss/dup
    assert all(t.status is not EpisodeStatus.FAILED for t in trajs)
    assert worker.actor_restarts == 1
    assert ray.get(worker.actors[0].pid.remote()) != victim_pid
    assert max(s.attempts for s in pending.shards) == 2
    worker.close()
