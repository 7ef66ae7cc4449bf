"""The dataset-adapter contract: turn a dataset file into ``list[BatchInput]``, loudly.

This module holds what every adapter shares: the :data:`ADAPTERS` registry, the signature, the failure policy
and the reading helpers. The built-in adapters (``synthetic``, ``locomo``, ``longmemeval``) are modules of
:mod:`memrl.adapters`, imported on the first registry lookup; a user adapter is either registered the same way
or named by dotted path (``pkg.mod:fn``).

An adapter is one registered function with one signature::

    @ADAPTERS.register("my_format")
    def my_format(path: str | None, *, split: str, lenient: bool, report: SkipReport,
                  **options) -> Iterable[BatchInput]: ...

An adapter may return a list or be a generator (``longmemeval`` is: its haystacks are long, the ``_m`` ones very
long). :func:`run_adapter` returns the list; :func:`stream_adapter` hands the episodes over one at
a time, so a consumer that releases each episode (``memrl bench memory``) never holds more than one haystack's
episodes (the file's text itself is read whole). When streaming, a strict error surfaces where the bad record
is reached; ``memrl data check`` validates a whole file first.

Failure policy (the same for every adapter):

* **strict** (``lenient=False``): the first bad record raises :class:`AdapterError`, whose message names the
  file, the record index, the field and what was expected.
* **lenient**: the bad record is skipped and the skip is written to the :class:`SkipReport` (same file /
  record / field / expectation). Nothing is dropped without an entry in the report.

Files are read with :func:`iter_json_records`, which decodes UTF-8 with ``surrogateescape`` so that a stray
non-UTF-8 byte is pinned to the record and field that contains it (instead of failing the whole file), and
walks a top-level JSON array element by element so that a truncated file still yields its complete records
and reports the cut one.

Very long turns: a turn longer than ``max_turn_chars`` (default 200,000 characters, ~50k tokens) is rejected
as a bad record with that reason. Nothing in memrl can use a turn that long (it exceeds every context window
and the fact extractor would stall on it), so it is flagged rather than silently truncated. Adapters accept
``max_turn_chars`` as an option to raise the limit.

Empty sessions are rejected too: every real LoCoMo/LongMemEval session has at least two turns, so an empty one
means a broken export (and would leave a session date with nothing to date).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memrl.data.jsonstream import JSONStreamError, iter_json_array, iter_json_lines
from memrl.data.sources import DatasetNotFound, resolve_path
from memrl.registry import Registry
from memrl.types import BatchInput, ContractError

if TYPE_CHECKING:
    from memrl.data.config import DataConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_TURN_CHARS = 200_000
# Split names an adapter may be asked for; "all" = the whole dataset. Every built-in adapter has train/test/all;
# "validation" exists only where a dataset defines one (locomo's ``split_scheme: memory_r1``), the others refuse it.
SPLITS = ("train", "validation", "test", "all")


class AdapterFn(Protocol):
    def __call__(
        self, path: str | None, *, split: str, lenient: bool, report: SkipReport, **options: Any
    ) -> Iterable[BatchInput]: ...


class AdapterError(ValueError):
    """A dataset record is malformed. ``file``/``record``/``field`` locate it; ``expected`` says what was wanted."""

    def __init__(
        self, file: str, record: int | str | None, field: str | None, expected: str, got: str = ""
    ) -> None:
        self.file = file
        self.record = record
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(self.describe())

    def describe(self) -> str:
        where = [str(self.file)]
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field:
            where.append(f"field {self.field!r}")
        tail = f"; got {self.got}" if self.got else ""
        return f"{', '.join(where)}: expected {self.expected}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "record": self.record,
            "field": self.field,
            "expected": self.expected,
            "got": self.got,
            "message": self.describe(),
        }


@dataclass
class SkipReport:
    """Every record an adapter skipped in lenient mode, with the reason (an :class:`AdapterError`)."""

    skips: list[AdapterError] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.skips)

    def add(self, error: AdapterError) -> None:
        logger.warning("skipped: %s", error)
        self.skips.append(error)

    def reasons(self) -> list[str]:
        return [e.describe() for e in self.skips]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.skips]


@contextlib.contextmanager
def record_guard(report: SkipReport, lenient: bool) -> Iterator[None]:
    """Run one record's conversion: strict → errors propagate; lenient → the error is reported and swallowed.

    ``ContractError`` (a BatchInput refusing a value) is re-raised as-is in strict mode; adapters convert the
    fields they know before building contracts, so a ContractError here is a bug worth seeing.
    """
    try:
        yield
    except AdapterError as exc:
        if not lenient:
            raise
        report.add(exc)


# ---------------------------------------------------------------------------------------------------------
# Reading files


_SURROGATE = re.compile("[\udc80-\udcff]")


def _undecodable(value: str) -> int | None:
    """Index of the first lone surrogate (= a non-UTF-8 byte read with surrogateescape), else None."""
    m = _SURROGATE.search(value)
    return None if m is None else m.start()


def iter_json_records(path: str, *, lenient: bool, report: SkipReport) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, record)`` for each element of the top-level JSON array in ``path``, reading the file
    in chunks (:mod:`memrl.data.jsonstream`): about one record is in memory at a time.

    A parse error (truncated file, garbage) at element ``i`` raises in strict mode; in lenient mode the
    complete elements before it are kept and one skip says where reading stopped and why.
    Files with the extension ``.jsonl`` are read one JSON value per line (a bad line skips just that line).
    """
    if not Path(path).is_file():
        raise AdapterError(str(path), None, None, "an existing dataset file", "no such file")
    if path.endswith(".jsonl"):
        yield from _iter_jsonl(path, lenient=lenient, report=report)
        return
    try:
        yield from iter_json_array(path)
    except JSONStreamError as exc:
        err = AdapterError(path, exc.index, None, exc.expected, exc.got)
        if not lenient or exc.index is None:
            raise err from exc
        report.add(err)


def _iter_jsonl(path: str, *, lenient: bool, report: SkipReport) -> Iterator[tuple[int, Any]]:
    for index, lineno, value in iter_json_lines(path):
        if isinstance(value, json.JSONDecodeError):
            err = AdapterError(path, index, None, "one JSON value per line", f"line {lineno}: {value.msg}")
            if not lenient:
                raise err from value
            report.add(err)
            continue
        yield index, value


# ---------------------------------------------------------------------------------------------------------
# Field access with located errors


@dataclass(frozen=True)
class RecordView:
    """Typed field access into one raw record; every failure names file, record and field path."""

    file: str
    record: int | str
    max_turn_chars: int = DEFAULT_MAX_TURN_CHARS

    def fail(self, field: str, expected: str, got: str = "") -> AdapterError:
        return AdapterError(self.file, self.record, field, expected, got)

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str = "", *, optional=False):
        """``obj[key]`` checked to be ``kind``; ``where`` is the field path of ``obj`` (for messages)."""
        path = f"{where}.{key}" if where else key
        if not isinstance(obj, Mapping):
            raise self.fail(where or "<record>", "a JSON object", type_name(obj))
        if key not in obj or obj[key] is None:
            if optional:
                return None
            raise self.fail(path, f"a {kind_name(kind)} (key is missing)", f"keys {sorted(obj)[:12]}")
        return self.check(obj[key], kind, path)

    def check(self, value: Any, kind: type | tuple[type, ...], path: str):
        # bool is an int in Python; a JSON true where a number is expected is a data error.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise self.fail(path, f"a {kind_name(kind)}", f"{type_name(value)} {_preview(value)}")
        if isinstance(value, str):
            self.check_text(value, path)
        return value

    def check_text(self, value: str, path: str) -> str:
        if len(value) > self.max_turn_chars:
            raise self.fail(
                path,
                f"at most max_turn_chars={self.max_turn_chars} characters",
                f"{len(value)} characters (raise the adapter option max_turn_chars if this is intended)",
            )
        bad = _undecodable(value)
        if bad is not None:
            byte = ord(value[bad]) - 0xDC00
            raise self.fail(path, "UTF-8 text", f"invalid byte 0x{byte:02x} at character {bad}")
        return value

    def json_list(self, obj: Any, key: str, where: str = "") -> list:
        """A list field; some exports store lists as JSON text (``"[\"a\", \"b\"]"``), which is accepted too."""
        value = self.get(obj, key, (list, str), where)
        if isinstance(value, str):
            path = f"{where}.{key}" if where else key
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = None
            if not isinstance(value, list):
                raise self.fail(path, "a JSON array (or a string holding one)", _preview(obj[key]))
        return value

    def text(self, value: Any, path: str) -> str:
        """A scalar answer/label as text: JSON numbers become their plain string form (``2022`` → ``"2022"``)."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(path, "a string or number", f"{type_name(value)} {_preview(value)}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return self.check_text(str(value), path)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "JSON object", list: "JSON array", str: "string", int: "integer", float: "number"}
    kinds = _as_tuple(kind)
    if float in kinds:  # "number" already covers integers
        kinds = tuple(k for k in kinds if k is not int)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", type(None): "null", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def in_split(key: str, split: str, test_fraction: float) -> bool:
    """Deterministic train/test assignment of a group (conversation, question) by a hash of its key.

    The whole group lands on one side, so a test conversation's sessions are never seen in training.
    """
    if split == "all":
        return True
    if split not in ("train", "test"):
        raise ValueError(f"split {split!r}: a hash split has only train and test (and all)")
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    bucket = int(hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()[:8], 16) / 2**32
    return (bucket < test_fraction) == (split == "test")


def build_episode(view: RecordView, field: str, **kwargs: Any) -> BatchInput:
    """``BatchInput(**kwargs)``, with a contract violation reported as a located AdapterError."""
    try:
        return BatchInput(**kwargs)
    except ContractError as exc:
        raise view.fail(field, "a valid episode", str(exc)) from exc


# ---------------------------------------------------------------------------------------------------------
# Registry and loading


# The built-in adapters live in memrl.adapters (one module each); they import this module's contract, and the
# registry imports them on first lookup.
BUILTIN_ADAPTER_MODULES = (
    "memrl.adapters.synthetic",
    "memrl.adapters.locomo",
    "memrl.adapters.longmemeval",
    "memrl.adapters.chats",
)


def _populate() -> None:
    for module in BUILTIN_ADAPTER_MODULES:
        importlib.import_module(module)


ADAPTERS: Registry[AdapterFn] = Registry("dataset adapter", populate=_populate)


def check_options(name: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Reject options the adapter does not take, listing the ones it does (a typo must not pass silently)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    valid = [n for n in valid if n not in ("split", "lenient", "report")]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"adapter {name!r} has no option(s) {unknown}; valid options: {', '.join(valid) or '(none)'}"
        )


def run_adapter(
    name: str,
    path: str | None,
    *,
    split: str = "train",
    lenient: bool = False,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[BatchInput], SkipReport]:
    """Look up adapter ``name`` (registry name or ``pkg.mod:fn``), run it, return episodes and skip report."""
    stream, report = stream_adapter(name, path, split=split, lenient=lenient, options=options)
    episodes = list(stream)
    logger.info(
        "adapter %s: %d episodes, %d skipped (%s)", name, len(episodes), report.skipped, path or "generated"
    )
    return episodes, report


def stream_adapter(
    name: str,
    path: str | None,
    *,
    split: str = "train",
    lenient: bool = False,
    options: Mapping[str, Any] | None = None,
) -> tuple[Iterator[BatchInput], SkipReport]:
    """:func:`run_adapter` one episode at a time: the report fills in as the iterator advances. Name, options
    and split are checked before anything is read; ``path`` is found as :func:`memrl.data.sources.resolve_path`
    says (as given, ``$MEMRL_DATA_DIR``, the ``memrl data fetch`` cache; unset = the dataset's default file)."""
    fn = ADAPTERS.get(name)
    options = dict(options or {})
    check_options(name, fn, options)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    try:
        path = resolve_path(name, path)
    except DatasetNotFound as exc:
        raise AdapterError(exc.path, None, None, "an existing dataset file", str(exc)) from exc
    report = SkipReport()
    return iter(fn(path, split=split, lenient=lenient, report=report, **options)), report


def load_dataset(cfg: DataConfig) -> tuple[list[BatchInput], SkipReport]:
    """Episodes for a :class:`~memrl.data.config.DataConfig` (adapter, path, split, lenient, options, limit)."""
    episodes, report = run_adapter(
        cfg.adapter, cfg.path, split=cfg.split, lenient=cfg.lenient, options=cfg.options
    )
    if cfg.limit is not None:
        episodes = episodes[: cfg.limit]
    return episodes, report


__all__ = [
    "ADAPTERS",
    "DEFAULT_MAX_TURN_CHARS",
    "SPLITS",
    "AdapterError",
    "AdapterFn",
    "RecordView",
    "SkipReport",
    "build_episode",
    "in_split",
    "iter_json_records",
    "load_dataset",
    "record_guard",
    "run_adapter",
]
