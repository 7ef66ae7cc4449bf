"""The user-facing docs stay short, runnable and linked: README length, recipe-sized commands, real paths.

A documented command is a recipe plus a few overrides: anything longer belongs in a recipe file under configs/,
where `memrl config show` can explain it. docs/experiments.md is the dated log and keeps its commands as they ran.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LOG = ROOT / "docs" / "experiments.md"
USER_DOCS = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p != LOG)]

MAX_README_LINES = 250
MAX_OVERRIDES = 2
# The keys every recipe leaves to the user: where the data is, where the run goes, which run, which adapter.
FREE_KEYS = {"data.path", "output_dir", "seed", "policy.lora_path"}
SUBCOMMANDS = "run|eval|train|report|inspect|data|serve|sandbox|bench|config"
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`")
_COMMAND = re.compile(rf"(?:^|[\s/(])memrl\s+(?:{SUBCOMMANDS})\b[^\n]*")
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CONFIG_PATH = re.compile(r"configs/[\w./-]+?\.yaml")
_RECIPE_NAME = re.compile(r"`([\w-]+\.yaml)`")


def _prose_and_blocks(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text outside fenced blocks, and each fenced block as (language, body)."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    return _FENCE.sub("", text), blocks


def commands(text: str) -> list[str]:
    """Every `memrl <subcommand> …` in shell blocks (continuations joined) and in inline code spans."""
    prose, blocks = _prose_and_blocks(text)
    found: list[str] = []
    for lang, body in blocks:
        if lang not in SHELL_LANGS:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            for m in _COMMAND.finditer(line):
                found.append(m.group(0))
    for m in _INLINE.finditer(prose):
        span = " ".join(m.group(1).split())  # a span may wrap across lines
        found.extend(c.group(0) for c in _COMMAND.finditer(span))
    # A comment, a chained command or a pipe ends a command.
    found = [" ".join(c.strip(" (/").split()) for c in found]
    return [re.split(r" (?:#|&&|;|\| )", c)[0].strip() for c in found]


def overrides(command: str) -> list[str]:
    """The `key=value` overrides of a command beyond the keys every recipe leaves free."""
    return [
        t.split("=", 1)[0]
        for t in (x.strip("[]'\"") for x in command.split())
        if _OVERRIDE.match(t) and t.split("=", 1)[0] not in FREE_KEYS
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    prose, _ = _prose_and_blocks(path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", prose, re.M)}


def test_the_override_counter_reads_documented_commands():
    text = (
        "Run `memrl eval --config configs/a.yaml data.path=F seed=1 x.y=2`.\n"
        "```bash\nmemrl train --config configs/b.yaml output_dir=R \\\n  'train.roles=[memory]' a.b=1 c.d=2  # why\n"
        "memrl run --config C --output-dir D && memrl inspect D\n```\n"
        "```python\nimport memrl\nmemrl train = 3\n```\n"
    )
    found = commands(text)
    assert found == [
        "memrl train --config configs/b.yaml output_dir=R 'train.roles=[memory]' a.b=1 c.d=2",
        "memrl run --config C --output-dir D",
        "memrl eval --config configs/a.yaml data.path=F seed=1 x.y=2",
    ]
    assert [overrides(c) for c in found] == [["train.roles", "a.b", "c.d"], [], ["x.y"]]
    assert _slug("LoCoMo on Memory-R1's split, next to published numbers") == (
        "locomo-on-memory-r1s-split-next-to-published-numbers"
    )


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the limit is {MAX_README_LINES}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_documented_commands_are_recipes_with_few_overrides(doc):
    too_long = []
    for command in commands(doc.read_text()):
        extra = overrides(command)
        if len(extra) > MAX_OVERRIDES:
            too_long.append(f"{command}\n    overrides beyond {sorted(FREE_KEYS)}: {extra}")
    assert not too_long, (
        f"{doc.relative_to(ROOT)}: commands with more than {MAX_OVERRIDES} overrides; "
        "put them in a recipe under configs/:\n  " + "\n  ".join(too_long)
    )


@pytest.mark.parametrize("doc", [*USER_DOCS, LOG], ids=lambda p: p.name)
def test_mentioned_config_files_exist(doc):
    text = doc.read_text()
    if doc == LOG:  # old entries name configs as they were; only the index names current recipes
        text = text.split("\n## Index\n", 1)[1].split("\n## ", 1)[0]
    # A recipe is named by its path, or in a table by its bare file name.
    table_rows = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    named = set(_CONFIG_PATH.findall(text)) | {f"configs/{n}" for n in _RECIPE_NAME.findall(table_rows)}
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"{doc.relative_to(ROOT)} names config files that do not exist: {missing}"


@pytest.mark.parametrize("doc", [*USER_DOCS, LOG], ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{doc.relative_to(ROOT)} has links that do not resolve: {broken}"


def test_every_result_has_its_number_interval_recipe_command_time_and_machine():
    columns = ["result", "number", "interval", "recipe", "command", "wall time", "machine"]
    rows = [line for line in (ROOT / "docs" / "results.md").read_text().splitlines() if line.startswith("|")]
    headers = [r for r in rows if r.startswith("| result |")]
    assert headers and all([c.strip() for c in h.strip("|").split("|")] == columns for h in headers)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if row in headers or set("".join(cells)) <= set("-"):
            continue
        assert len(cells) == len(columns) and all(cells), f"docs/results.md: incomplete row: {row}"


def test_the_experiment_log_index_lists_every_entry_with_its_commit():
    text = LOG.read_text()
    _, _, entries = text.partition("\n## Index\n")
    index, _, entries = entries.partition("\n## ")
    headings = re.findall(r"^## (.*)$", "## " + entries, re.M)
    rows = [r for r in index.splitlines() if r.startswith("| ") and not r.startswith("| date ")]
    linked = [re.search(r"\]\(#([^)]+)\)", r).group(1) for r in rows]
    assert linked == [_slug(h) for h in headings], (
        "docs/experiments.md: the index must list every entry, in order"
    )
    commits = [r.rstrip(" |").rsplit("|", 1)[1].strip() for r in rows]
    assert all(re.fullmatch(r"[0-9a-f]{7,40}", c) for c in commits), f"index rows without a commit: {commits}"
