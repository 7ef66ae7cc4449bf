"""Where dataset files come from: the official downloads, ``memrl data fetch``, and how a config finds a file.

A config names its file with ``data.path``. A path that exists is used as it is; otherwise a relative path (or,
when ``data.path`` is unset, the dataset's default file) is looked up, in order, in::

    ./<path>                                     as given, relative to the working directory
    $MEMRL_DATA_DIR/<path>                       a folder of dataset files ...
    $MEMRL_DATA_DIR/<dataset>/<file name>        ... flat or one subfolder per dataset
    $MEMRL_CACHE_DIR/datasets/<dataset>/<file>   where ``memrl data fetch <dataset>`` puts it

and a miss raises :class:`DatasetNotFound` naming every place searched and the ``memrl data fetch`` command.

``memrl data fetch`` (:func:`fetch`) downloads into a ``.part`` file, resumes an interrupted download with an
HTTP ``Range`` request, checks the SHA-256 before renaming the file into place, and fails with
:class:`FetchError` (what to do offline) when the host cannot be reached. A file whose publisher gives no
checksum here (LongMemEval ``_s`` / ``_m``) gets its SHA-256 recorded on the first download
(``checksums.json`` next to it); later fetches and re-checks are held to that record.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.paths import cache_dir, data_dir

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
RECORD_FILE = "checksums.json"
_HF = "https://huggingface.co/datasets/xiaowu0162/longmemeval/resolve/main"


@dataclass(frozen=True)
class OfficialFile:
    """One downloadable file. ``sha256`` is None when no checksum is pinned (recorded on first download)."""

    name: str
    url: str
    sha256: str | None
    size_hint: str = ""  # for help texts


@dataclass(frozen=True)
class DatasetSource:
    """A dataset's official files; ``files[0]`` is the default a config gets when ``data.path`` is unset."""

    name: str
    homepage: str
    license: str
    files: tuple[OfficialFile, ...]

    def file(self, name: str) -> OfficialFile:
        for f in self.files:
            if f.name == name:
                return f
        raise ValueError(
            f"{self.name} has no official file {name!r}; files: {', '.join(f.name for f in self.files)}"
        )


SOURCES: Mapping[str, DatasetSource] = {
    "locomo": DatasetSource(
        name="locomo",
        homepage="https://github.com/snap-research/locomo",
        license="CC BY-NC 4.0",
        files=(
            OfficialFile(
                "locomo10.json",
                "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json",
                "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4",
                "2.8 MB",
            ),
        ),
    ),
    "longmemeval": DatasetSource(
        name="longmemeval",
        homepage="https://github.com/xiaowu0162/LongMemEval",
        license="MIT",
        files=(
            OfficialFile(
                "longmemeval_oracle.json",
                f"{_HF}/longmemeval_oracle.json",
                "939b4ad26703d9f51d718c7a978ac65bbc4c32cdc578155111eb37ecd4f25702",
                "14 MB",
            ),
            OfficialFile("longmemeval_s.json", f"{_HF}/longmemeval_s.json", None, "~280 MB"),
            OfficialFile("longmemeval_m.json", f"{_HF}/longmemeval_m.json", None, "~2.7 GB"),
        ),
    ),
}


def source(name: str) -> DatasetSource:
    if name not in SOURCES:
        raise ValueError(f"no downloadable dataset {name!r}; valid choices: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def fetch_dir(dataset: str) -> Path:
    """Where ``memrl data fetch <dataset>`` puts its files."""
    return cache_dir() / "datasets" / dataset


def fetch_command(dataset: str, file_name: str | None = None) -> str:
    if file_name in [f.name for f in source(dataset).files[1:]]:
        return f"memrl data fetch {dataset} --file {file_name}"
    return f"memrl data fetch {dataset}"


# ---------------------------------------------------------------------------------------------------------
# Finding a configured file


class DatasetNotFound(FileNotFoundError):
    """No file at ``data.path`` nor in any place it is looked up; the message says how to get it."""

    def __init__(self, path: str, searched: list[Path], hint: str) -> None:
        self.path = path
        self.searched = searched
        self.hint = hint
        super().__init__(f"no such file {path!r} (looked in: {', '.join(map(str, searched))}); {hint}")


def _dataset_of(adapter: str, file_name: str) -> str | None:
    """The dataset a file belongs to: the adapter's own, else the one that publishes a file of that name."""
    if adapter in SOURCES:
        return adapter
    for src in SOURCES.values():
        if any(f.name == file_name for f in src.files):
            return src.name
    return None


def search_path(adapter: str, path: str | None) -> list[Path]:
    """Where a configured ``data.path`` is looked for, in order (empty: the adapter reads no file)."""
    if path in (None, "", "-"):  # no file named ("-": generated data)
        if adapter not in SOURCES:
            return []
        path = SOURCES[adapter].files[0].name
    given = Path(path).expanduser()
    if given.is_absolute():
        return [given]
    dataset = _dataset_of(adapter, given.name)
    places = [given]
    root = data_dir()
    if root is not None:
        places.append(root / given)
        if dataset is not None:
            places.append(root / dataset / given.name)
    if dataset is not None:
        places.append(fetch_dir(dataset) / given.name)
    return list(dict.fromkeys(places))


def resolve_path(adapter: str, path: str | None) -> str | None:
    """The file ``data.path`` refers to (see the module docstring); None when the adapter reads no file. A path
    found nowhere is returned unchanged unless it is a dataset memrl can fetch (then :class:`DatasetNotFound`)."""
    places = search_path(adapter, path)
    if not places:
        return path
    for place in places:
        if place.is_file():
            return str(place)
    name = path if path not in (None, "", "-") else places[0].name
    dataset = _dataset_of(adapter, Path(name).name)
    if dataset is None:  # not a file memrl knows: the adapter says what is wrong with it
        return path
    hint = (
        f"download it with `{fetch_command(dataset, Path(name).name)}`, or set data.path=/path/to/file or "
        "MEMRL_DATA_DIR=/folder/with/the/files"
    )
    raise DatasetNotFound(name, places, hint)


# ---------------------------------------------------------------------------------------------------------
# Downloading


class FetchError(RuntimeError):
    """A download could not be done (host unreachable, HTTP error, interrupted); the message says what next."""


class ChecksumError(FetchError):
    """A downloaded or present file does not have the expected SHA-256."""


Opener = Callable[..., Any]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: Path, *, opener: Opener = urllib.request.urlopen, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest.part``, continuing a partial ``.part`` with a ``Range`` request.

    Returns the ``.part`` path (complete; the caller checks it and renames it). A server that ignores the
    range (status 200) restarts the file; 416 (range not satisfiable) means the part is already complete.
    An interrupted transfer keeps what arrived, so running again resumes.
    """
    part = dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "memrl-data-fetch"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = opener(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return part
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(
            f"cannot reach {url} ({reason}). Is this machine offline? Download the file elsewhere and put it "
            f"in {dest.parent} (or in $MEMRL_DATA_DIR, or pass data.path=/path/to/it)"
        ) from exc
    with response:
        resumed = bool(have) and getattr(response, "status", None) == 206
        if resumed and not str(response.headers.get("Content-Range", "")).startswith(f"bytes {have}-"):
            raise FetchError(
                f"{url}: asked for bytes {have}- but got {response.headers.get('Content-Range')}"
            )
        if have and not resumed:
            logger.info("%s: server sent the whole file; starting over", url)
        written = have if resumed else 0
        try:
            with part.open("ab" if resumed else "wb") as f:
                for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                    f.write(chunk)
                    written += len(chunk)
        except (OSError, http.client.HTTPException) as exc:
            raise FetchError(
                f"{url}: download interrupted after {written} bytes ({exc}); run the command again to resume"
            ) from exc
        length = response.headers.get("Content-Length")
        # http.client returns a short body without an error when the connection drops mid-file.
        if length is not None and written - (have if resumed else 0) < int(length):
            raise FetchError(
                f"{url}: download interrupted after {written} bytes (connection closed early); run the command "
                "again to resume"
            )
    return part


def _records(folder: Path) -> dict[str, str]:
    path = folder / RECORD_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(folder: Path, name: str, digest: str) -> None:
    records = _records(folder)
    records[name] = digest
    tmp = folder / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / RECORD_FILE)


@dataclass(frozen=True)
class Fetched:
    name: str
    path: str
    sha256: str
    bytes: int
    status: str  # "downloaded" | "present"
    checksum: str  # "pinned" | "recorded" (first download, no published checksum)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def fetch_file(
    spec: OfficialFile, folder: Path, *, opener: Opener = urllib.request.urlopen, force: bool = False
) -> Fetched:
    """Make ``folder/spec.name`` the official file: keep a present file that checks out, else download it."""
    dest = folder / spec.name
    expected = spec.sha256 or _records(folder).get(spec.name)
    kind = "pinned" if spec.sha256 else "recorded"
    status = "present"
    if force or not dest.is_file():
        part = download(spec.url, dest, opener=opener)
        digest = sha256_of(part)
        if expected is not None and digest != expected:
            part.unlink()
            raise ChecksumError(
                f"{spec.url}: SHA-256 {digest} but expected {expected} ({kind}); the partial file was removed, "
                "run the command again to download it from scratch"
            )
        os.replace(part, dest)
        status = "downloaded"
    else:
        digest = sha256_of(dest)
        if expected is not None and digest != expected:
            raise ChecksumError(
                f"{dest}: SHA-256 {digest} but expected {expected} ({kind}); delete it or fetch with --force"
            )
    if expected is None:
        _record(folder, spec.name, digest)
        logger.warning("%s: no published checksum; recorded SHA-256 %s for later fetches", spec.name, digest)
    return Fetched(spec.name, str(dest), digest, dest.stat().st_size, status, kind)


def fetch(
    dataset: str,
    files: Iterable[str] | None = None,
    *,
    folder: Path | None = None,
    opener: Opener = urllib.request.urlopen,
    force: bool = False,
) -> list[Fetched]:
    """Fetch ``files`` (default: the dataset's first file) of ``dataset`` into ``folder`` (default: the cache).

    Example::

        fetch("locomo")                                   # ~/.cache/memrl/datasets/locomo/locomo10.json
        fetch("longmemeval", ["longmemeval_s.json"])
    """
    src = source(dataset)
    specs = [src.file(name) for name in files] if files else [src.files[0]]
    folder = folder if folder is not None else fetch_dir(dataset)
    folder.mkdir(parents=True, exist_ok=True)
    return [fetch_file(spec, folder, opener=opener, force=force) for spec in specs]


__all__ = [
    "SOURCES",
    "ChecksumError",
    "DatasetNotFound",
    "DatasetSource",
    "FetchError",
    "Fetched",
    "OfficialFile",
    "download",
    "fetch",
    "fetch_dir",
    "resolve_path",
    "search_path",
]
