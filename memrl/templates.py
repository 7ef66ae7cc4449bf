"""Prompt templates and chat encoding, shared by every part that prompts a model: the target-turn prompt
(:mod:`memrl.episode.prompt`), the LLM fact extractor and compressor (:mod:`memrl.memory`), and the judge reward.

Templates are Jinja files, bundled (``target_turn.j2``, ``memory_extract.j2``, ...) or given by path, rendered
with ``StrictUndefined`` so a missing variable fails loudly. :func:`encode_chat` gives the prompt's token ids
through the tokenizer's chat template with a generation prompt; a tokenizer without one gets
:data:`PLAIN_CHAT_FORMAT`.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

# Used only when the tokenizer has no chat template. One line per role marker; generation starts after
# "<|assistant|>\n".
PLAIN_CHAT_FORMAT = "<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n"


@functools.lru_cache(maxsize=16)
def load_template(name: str) -> jinja2.Template:
    """A bundled template by file name (``target_turn.j2``) or a path to a Jinja file."""
    path = Path(name)
    if path.is_file():
        source = path.read_text(encoding="utf-8")
    else:
        resource = importlib.resources.files("memrl.prompts") / name
        if not resource.is_file():
            bundled = sorted(
                p.name for p in importlib.resources.files("memrl.prompts").iterdir() if p.name.endswith(".j2")
            )
            raise FileNotFoundError(
                f"prompt template {name!r} is neither a file nor a bundled template; bundled: {bundled}"
            )
        source = resource.read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)
    return env.from_string(source)


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
