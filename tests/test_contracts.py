"""What training reads from a step is typed: no module of ``memrl/train`` or ``memrl/data`` reads ``extra``.

``StepMeta.extra`` is display-only (inspect, notebooks); the role, the credit group and the credit's inputs of a
memory write are fields of the contract (``StepMeta.role``, ``credit_group``, ``write``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memrl

ROOT = Path(memrl.__file__).parent
TRAINING_PACKAGES = ("train", "data")


def extra_reads(source: str, filename: str = "<string>") -> list[int]:
    """Line numbers where ``source`` reads an attribute named ``extra`` (``x.extra``, ``x.extra[k]``,
    ``x.extra.get(k)``, ``getattr(x, "extra")``). Passing ``extra=`` to a constructor is not a read."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "extra"
            and isinstance(node.ctx, ast.Load)
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "extra"
            )
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_extra_reads_finds_every_form_of_read():
    src = (
        "a = step.meta.extra['credit_group']\n"
        "b = step.meta.extra.get('role')\n"
        "c = 'x' in meta.extra\n"
        "d = getattr(meta, 'extra')\n"
        "e = StepMeta(turn_id='t', extra={'question': 'q'})\n"
        "extra = 1\n"
    )
    assert extra_reads(src) == [1, 2, 3, 4]


@pytest.mark.parametrize("package", TRAINING_PACKAGES)
def test_training_code_never_reads_extra(package):
    found = {
        str(path.relative_to(ROOT.parent)): lines
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := extra_reads(path.read_text(), str(path)))
    }
    assert not found, (
        f"memrl/{package} reads `.extra` (display-only; read the typed StepMeta fields role / credit_group / "
        f"write instead): {found}"
    )


def test_typed_step_fields_survive_the_parquet_row_and_the_jsonl_dump(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memrl.episode.output import SCHEMA
    from memrl.episode.rows import step_meta_of_row, step_rows
    from memrl.serialize import episode_from_dict, to_dict
    from memrl.types import EpisodeTrajectory, MemoryWrite, StepMeta, StepTrajectory, TurnRole

    write = MemoryWrite(
        index=0, alternative=1, alternatives=2, applied=False, op_score=0.5, snapshot_reward=0.25
    )
    meta = StepMeta(
        turn_id="D1:2", turn_role=TurnRole.HISTORY, role="memory", write=write, credit_group="g/memory/0",
        source_episode_id="e", extra={"read_turns": ["[x] A: hi"]},
    )  # fmt: skip
    steps = (
        StepTrajectory("e/w0.1", (1, 2), (3,), (1,), (-0.5,), "D1:2", TurnRole.HISTORY, meta),
        StepTrajectory(
            "e/t0", (1, 2), (4,), (1,), (-0.1,), "q", meta=StepMeta(turn_id="q", source_episode_id="e")
        ),
    )
    ep = EpisodeTrajectory("e", "g", steps, 1.0, "completed", step_rewards_ext=(0.3, None))
    path = tmp_path / "part.parquet"
    pq.write_table(pa.Table.from_pylist(step_rows([ep]), schema=SCHEMA), path)
    rows = pq.read_table(path).to_pylist()
    assert [step_meta_of_row(r) for r in rows] == [s.meta for s in steps]
    assert rows[0]["role"] == "memory" and rows[1]["role"] == "answer" and rows[1]["credit_group"] is None
    assert episode_from_dict(to_dict(ep)) == ep
