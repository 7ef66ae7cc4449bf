"""Both notebooks execute top to bottom (nbclient, a real kernel) and produce their figures."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _load(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name} ships with stored outputs"
    return nb


def _execute(names: list[str], tmp_path: Path, env: dict[str, str]) -> list[nbformat.NotebookNode]:
    """Run the notebooks concurrently, each in its own kernel (kernel start-up dominates their run time)."""
    nbs = [_load(n) for n in names]
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # kernels inherit the environment of their launcher

    async def run_all() -> None:
        clients = [
            NotebookClient(
                nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
            )
            for nb in nbs
        ]
        await asyncio.gather(*(c.async_execute() for c in clients))

    try:
        asyncio.run(run_all())
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nbs


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if kind in o.get("data", {})]


def _ran_all(nb) -> None:
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]


@pytest.fixture(scope="module")
def executed(demo_run, train_dir, tmp_path_factory):
    env = {"MEMRL_RUN_DIR": str(demo_run), "MEMRL_TRAIN_DIR": str(train_dir), "HF_HUB_OFFLINE": "1"}
    return _execute(["inspect_episode.ipynb", "training_curves.ipynb"], tmp_path_factory.mktemp("nb"), env)


def test_inspect_episode_notebook(executed):
    nb = executed[0]
    _ran_all(nb)
    assert (
        len(_outputs(nb, "image/png")) == 4
    )  # memory size, retrieval hits, rewards per group, rollback tokens
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "text/html"))
    assert '<svg id="tree"' in html and '<li class="fact' in html


def test_training_curves_notebook(executed):
    nb = executed[1]
    _ran_all(nb)
    assert len(_outputs(nb, "image/png")) == 2  # by step, by generated tokens


@pytest.mark.slow
def test_notebooks_run_on_their_embedded_defaults(tmp_path):
    """No env vars: the notebooks make their own demo run and tiny training run (minutes on CPU)."""
    # The notebooks make their demo runs in tempfile.mkdtemp() dirs and keep them (a reader may want to look);
    # the kernels inherit TMPDIR, so here those land in pytest's tmp_path instead of staying behind in /tmp.
    env = {"MEMRL_RUN_DIR": "", "MEMRL_TRAIN_DIR": "", "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    inspect_nb, train_nb = _execute(["inspect_episode.ipynb", "training_curves.ipynb"], tmp_path, env)
    _ran_all(inspect_nb)
    assert len(_outputs(inspect_nb, "image/png")) == 4
    _ran_all(train_nb)
    assert len(_outputs(train_nb, "image/png")) == 2
