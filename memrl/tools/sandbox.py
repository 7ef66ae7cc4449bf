"""The python sandbox: run model-written code contained, many calls in parallel under a concurrency limit.

    with Sandbox(SandboxConfig(timeout_s=2)) as sb:
        r = sb.run("print(6 * 7)")          # SandboxResult(exit_code=0, stdout='42\\n', ...)
        rs = sb.run_many(["1/0", "while True: pass"])

Isolation comes from the launcher (``tools.sandbox.mode``; see :mod:`memrl.tools.launchers`); this module
owns the pool, the supervision of each process tree and the result shape that ``memrl sandbox run`` prints.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from memrl.tools.base import ToolInfraError
from memrl.tools.config import SandboxConfig
from memrl.tools.launchers import LAUNCHERS
from memrl.tools.process import CappedBuffer, supervise

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxResult:
    """One finished call. ``exit_code`` is the interpreter's (bwrap passes it through; 1 for an uncaught
    exception, 128+N when a signal N ended it); ``-9`` when the sandbox was killed by us."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # None | "timeout" | "output_limit" | "memory" (cgroup OOM kill)
    duration_s: float = 0.0
    kill_latency_s: float | None = None
    stdout_bytes: int = 0  # totals before capping
    stderr_bytes: int = 0
    extra: dict = field(default_factory=dict)  # e.g. {"pid_namespace": inode} in bwrap mode

    def to_json(self) -> dict:
        """The shape ``memrl sandbox run --json`` prints."""
        keys = ("exit_code", "stdout", "stderr", "timed_out", "killed_reason")
        return {k: v for k, v in asdict(self).items() if k in keys}


class Sandbox:
    """A pool of at most ``cfg.concurrency`` sandboxed interpreters running at once. Thread-safe."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.launcher = LAUNCHERS.get(cfg.mode)(cfg)
        self._slots = threading.BoundedSemaphore(cfg.concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

    # -- one call -------------------------------------------------------------------------------------
    def run(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` to completion or until killed; blocks while all pool slots are busy."""
        if self._closed:
            raise ToolInfraError("the sandbox pool is closed")
        with self._slots:
            return self._run_now(code, self.cfg.timeout_s if timeout_s is None else timeout_s)

    def _run_now(self, code: str, timeout_s: float) -> SandboxResult:
        t0 = time.monotonic()
        spawned = self.launcher.spawn(code)
        out, err = CappedBuffer(self.cfg.capture_bytes), CappedBuffer(self.cfg.capture_bytes)
        try:
            sup = supervise(
                spawned.proc,
                {spawned.stdout_fd: out, spawned.stderr_fd: err},
                spawned.ready_fd,
                spawned.status_fd,
                deadline=t0 + timeout_s,
                max_stream_bytes=self.cfg.max_stream_bytes,
            )
            oom_kills = spawned.cgroup.oom_kills() if spawned.cgroup is not None else 0
        finally:
            for fn in spawned.cleanup:
                fn()
            if spawned.cgroup is not None:
                spawned.cgroup.remove()
        if not sup.ready and sup.killed_reason is None:
            # Nothing of the user's ran: bwrap or the interpreter failed to start. Code cannot fake this (the
            # ready byte is written before its first line), so a failing program is never an infra error.
            raise ToolInfraError(
                f"the {self.cfg.mode} sandbox failed to start the interpreter (exit {sup.returncode}): "
                f"{err.text().strip()[:500]}"
            )
        extra = {}
        if "pid-namespace" in sup.status:
            extra["pid_namespace"] = int(sup.status["pid-namespace"])
        exit_code = int(sup.status["exit-code"]) if sup.status_complete else sup.returncode
        killed_reason = sup.killed_reason
        if killed_reason is not None:
            exit_code = -signal.SIGKILL
        elif oom_kills and exit_code != 0:  # the kernel OOM-killed inside the call's memory cgroup
            killed_reason = "memory"
        if oom_kills:
            extra["oom_kills"] = oom_kills
        return SandboxResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text(),
            timed_out=sup.timed_out,
            killed_reason=killed_reason,
            duration_s=time.monotonic() - t0,
            kill_latency_s=sup.kill_latency_s,
            stdout_bytes=out.total,
            stderr_bytes=err.total,
            extra=extra,
        )

    # -- many calls -----------------------------------------------------------------------------------
    def run_many(self, codes: Sequence[str], timeout_s: float | None = None) -> list[SandboxResult]:
        """Run all ``codes`` in parallel (at most ``cfg.concurrency`` at once); results in input order."""
        if not codes:
            return []
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="memrl-sandbox")
            pool = self._pool
        futures = [pool.submit(self.run, code, timeout_s) for code in codes]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._closed = True
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
