"""Prompt templates and chat encoding, shared by every part that prompts a model: the target-turn prompt
(:mod:`memrl.episode.prompt`), the LLM fact extractor and compressor (:mod:`memrl.memory`), and the judge reward.

Templates are Jinja files, bundled (``target_turn.j2``, ``memory_extract.j2``, ...) or given by path, rendered
with ``StrictUndefined`` so a missing variable fails loudly. :func:`encode_chat` gives the prompt's token ids
through the tokenizer's chat template with a generation prompt; a tokenizer without one gets
:data:`PLAIN_CHAT_FORMAT`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

# Used only when the tokenizer has no chat template. One line per role marker; generation starts after
# "<|assistant|>\n".
PLAIN_CHAT_FORMAT = "<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n"


def _bundled() -> list[str]:
    return sorted(
        p.name for p in importlib.resources.files("memrl.prompts").iterdir() if p.name.endswith(".j2")
    )


def template_source(name: str) -> str:
    """The Jinja source of a bundled template by file name (``target_turn.j2``) or of a path to a Jinja file."""
    path = Path(name)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    resource = importlib.resources.files("memrl.prompts") / name
    if not resource.is_file():
        raise FileNotFoundError(
            f"prompt template {name!r} is neither a file nor a bundled template; bundled: {_bundled()}"
        )
    return resource.read_text(encoding="utf-8")


def templates_digest(*names: str) -> str:
    """A hash of every bundled template's source and of the named ones (a path's file): what a cached result
    computed with these prompts depends on beyond the config, which names a template but not its text."""
    h = hashlib.sha256()
    for name in [*_bundled(), *names]:
        h.update(name.encode("utf-8") + b"\0" + template_source(name).encode("utf-8") + b"\0")
    return h.hexdigest()[:20]


@functools.lru_cache(maxsize=16)
def load_template(name: str) -> jinja2.Template:
    """A bundled template by file name (``target_turn.j2``) or a path to a Jinja file."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)
    return env.from_string(template_source(name))


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Chat-template ids with a generation prompt; handles list / BatchEncoding / tensor return types."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(out, Mapping) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        if hasattr(out, "tolist"):
            out = out.tolist()
        if out and isinstance(out[0], (list, tuple)):  # batched return of a single conversation
            out = out[0]
        return [int(t) for t in out]
    text = render_plain_chat(messages)
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def render_plain_chat(messages: Sequence[Mapping[str, str]]) -> str:
    by_role = {m["role"]: m["content"] for m in messages}
    return PLAIN_CHAT_FORMAT.format(system=by_role.get("system", ""), user=by_role.get("user", ""))
