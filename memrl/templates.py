"""Prompt templates and chat encoding, shared by every part that prompts a model: the target-turn prompt
(:mod:`memrl.episode.prompt`), the LLM fact extractor and compressor (:mod:`memrl.memory`), and the judge reward.

Templates are Jinja files, bundled (``target_turn.j2``, ``memory_extract.j2``, ...) or given by path, rendered
with ``StrictUndefined`` so a missing variable fails loudly. :func:`encode_chat` gives the prompt's token ids
through the tokenizer's chat template with a generation prompt; a tokenizer without one gets
:data:`PLAIN_CHAT_FORMAT`.

The system text is never lost: a chat template that raises on the system role (Gemma 2) or renders without
the system text (the first Phi-3-mini template) gets it folded into the first user message
(``system + "\n\n" + user``), logged once per tokenizer; if even that loses it, :class:`ChatTemplateError`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

logger = logging.getLogger(__name__)

# Used only when the tokenizer has no chat template (a base model). One line per role marker; generation starts
# after "<|assistant|>\n". Its ids are the text's without special tokens, after the tokenizer's bos when it adds
# one (add_bos_token, or a post-processor that does); never an eos.
PLAIN_CHAT_FORMAT = "<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n"


def _bundled() -> list[str]:
    return sorted(
        p.name for p in importlib.resources.files("memrl.prompts").iterdir() if p.name.endswith(".j2")
    )


def template_source(name: str) -> str:
    """The Jinja source of a bundled template by file name (``target_turn.j2``), of a path to a Jinja file, or
    of a file shipped inside a package (``memrl.methods.memory_r1:answer.j2``, how a plugin names its own)."""
    path = Path(name)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    package, sep, file = name.rpartition(":")
    if sep and package and "/" not in package:
        try:
            resource = importlib.resources.files(package) / file
        except ModuleNotFoundError as exc:
            raise FileNotFoundError(f"prompt template {name!r}: no package {package!r}") from exc
        if not resource.is_file():
            raise FileNotFoundError(f"prompt template {name!r}: package {package!r} has no file {file!r}")
        return resource.read_text(encoding="utf-8")
    resource = importlib.resources.files("memrl.prompts") / name
    if not resource.is_file():
        raise FileNotFoundError(
            f"prompt template {name!r} is neither a file, a package's file (package:file.j2) nor a bundled "
            f"template; bundled: {_bundled()}"
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
    """A bundled template by file name (``target_turn.j2``), a path to a Jinja file, or ``package:file.j2``."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)
    return env.from_string(template_source(name))


class ChatTemplateError(ValueError):
    """A tokenizer's chat template loses the system text even folded into the first user message."""


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The prompt's ids: the tokenizer's chat template with a generation prompt, the system text folded into the
    first user message where the template rejects or drops it (:func:`render_chat`); a tokenizer without a chat
    template gets :data:`PLAIN_CHAT_FORMAT` (:func:`encode_plain_chat`)."""
    if not getattr(tokenizer, "chat_template", None):
        return encode_plain_chat(tokenizer, messages)
    text = render_chat(tokenizer, messages)
    if not isinstance(text, str):  # a tokenizer whose apply_chat_template gives ids whatever it is asked
        return _as_ids(text)
    # What apply_chat_template(tokenize=True) does with the text it renders: the template wrote the special tokens.
    return _as_ids(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The chat template's text for ``messages`` with a generation prompt, keeping every system message's text.

    The template renders the messages as given. Where it raises (Gemma 2: "System role not supported") or its
    text lacks a system message's content (some Phi-3 templates drop the system role silently; Mistral's keeps
    it only when a user message comes last), the system messages are folded into the first user message
    (``system + "\n\n" + user``, see :func:`fold_system`) and rendered again. Which of the three happened is
    logged at INFO once per tokenizer. If the folded text still lacks the system content,
    :class:`ChatTemplateError` names the tokenizer and its template.
    """
    messages = [dict(m) for m in messages]
    systems = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    try:
        text = _apply(tokenizer, messages)
    except Exception as exc:  # jinja's raise_exception, or a template that indexes what it does not expect
        if not systems:
            raise
        folded = fold_system(messages)
        try:
            text = _apply(tokenizer, folded)
        except Exception as fold_exc:
            raise fold_exc from exc
        _check_kept(tokenizer, text, messages, systems)
        _log_once(
            tokenizer, "raised", f"raised on the system role ({exc}); folded into the first user message"
        )
        return text
    if not isinstance(text, str) or not _lost(text, messages, systems):
        if any(x.strip() for x in systems):
            _log_once(tokenizer, "native", "renders the system message in place")
        return text
    text = _apply(tokenizer, fold_system(messages))
    _check_kept(tokenizer, text, messages, systems)
    _log_once(tokenizer, "dropped", "drops the system text; folded into the first user message")
    return text


def fold_system(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """The messages without system messages, their text (joined by a blank line; empty ones left out) put
    before the first user message's content, separated by a blank line; with no user message, it becomes one."""
    systems = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    systems = [x for x in systems if x.strip()]
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    if not systems:
        return rest
    system = "\n\n".join(systems)
    for m in rest:
        if m.get("role") == "user":
            m["content"] = system + "\n\n" + str(m.get("content") or "")
            break
    else:
        rest.insert(0, {"role": "user", "content": system})
    return rest


def encode_plain_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """:data:`PLAIN_CHAT_FORMAT`'s ids for a tokenizer without a chat template (a base model): the text without
    special tokens, after the tokenizer's bos token when it adds one (Gemma 3 270M base: ``<bos>`` first);
    never an eos (a byte-level ByT5 tokenizer appends one with special tokens on: the prompt would end there)."""
    ids = _as_ids(tokenizer(render_plain_chat(messages), add_special_tokens=False)["input_ids"])
    bos = _added_bos(tokenizer)
    return ids if bos is None else [bos, *ids]


def render_plain_chat(messages: Sequence[Mapping[str, str]]) -> str:
    by_role = {m["role"]: m["content"] for m in messages}
    return PLAIN_CHAT_FORMAT.format(system=by_role.get("system", ""), user=by_role.get("user", ""))


def _apply(tokenizer: Any, messages: list[dict[str, str]]) -> Any:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _as_ids(out: Any) -> list[int]:
    """Ids from a list / BatchEncoding / tensor, a batch of one conversation unwrapped."""
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        out = out[0]
    return [int(t) for t in out]


def _added_bos(tokenizer: Any) -> int | None:
    """The bos id where the tokenizer defines a bos token and adds it: ``add_bos_token`` set, or encoding with
    special tokens puts it first (a post-processor that adds it, as Llama 3's does, without the attribute)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    if getattr(tokenizer, "add_bos_token", False) is True:
        return int(bos)
    probe = "a"
    with_special = _as_ids(tokenizer(probe, add_special_tokens=True)["input_ids"])
    without = _as_ids(tokenizer(probe, add_special_tokens=False)["input_ids"])
    return int(bos) if with_special[:1] == [bos] and without[:1] != [bos] else None


def _lost(text: str, messages: Sequence[Mapping[str, str]], systems: Sequence[str]) -> bool:
    """Whether ``text`` lacks a system message's content (stripped: templates trim): it must occur there more
    often than in the other messages, so a user message quoting it does not count."""
    for system in systems:
        needle = system.strip()
        if not needle:
            continue
        elsewhere = sum(
            str(m.get("content") or "").count(needle) for m in messages if m.get("role") != "system"
        )
        if text.count(needle) <= elsewhere:
            return True
    return False


def _check_kept(
    tokenizer: Any, text: Any, messages: Sequence[Mapping[str, str]], systems: Sequence[str]
) -> None:
    """Raise where the folded rendering still lacks a system message's text."""
    if isinstance(text, str) and _lost(text, messages, systems):
        raise ChatTemplateError(
            f"the chat template of tokenizer {_name(tokenizer)} (template sha256 {_digest(tokenizer)}) loses the "
            "system message's text even folded into the first user message: give the tokenizer a chat template "
            "that renders it, or none to use the plain format"
        )


def _name(tokenizer: Any) -> str:
    path = getattr(tokenizer, "name_or_path", "") or ""
    return f"{type(tokenizer).__name__}({path!r})" if path else type(tokenizer).__name__


def _digest(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return hashlib.sha256(repr(template).encode("utf-8")).hexdigest()[:12]


# tokenizer -> {(template digest, outcome)} already logged; by id where a tokenizer takes no weak reference.
_logged: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_logged_by_id: dict[int, set[tuple[str, str]]] = {}
_log_lock = threading.Lock()


def _log_once(tokenizer: Any, outcome: str, what: str) -> None:
    key = (_digest(tokenizer), outcome)
    with _log_lock:
        try:
            seen = _logged.setdefault(tokenizer, set())
        except TypeError:
            seen = _logged_by_id.setdefault(id(tokenizer), set())
        if key in seen:
            return
        seen.add(key)
    logger.info("chat template of %s %s", _name(tokenizer), what)
