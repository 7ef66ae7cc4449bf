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
