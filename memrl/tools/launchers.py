"""How a sandboxed interpreter is started (registry :data:`LAUNCHERS`, chosen by ``tools.sandbox.mode``).

Both launchers run the same bootstrap: it applies the rlimits to itself (so every child inherits them), reads
the program from stdin (a memfd private to the call: no file on disk, no pipe to deadlock on) and executes it as
``<sandbox>``; an uncaught exception prints a normal traceback without the bootstrap's frame and exits 1.
The environment is built from nothing — no host variable reaches the code.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memrl.registry import Registry
from memrl.tools import seccomp
from memrl.tools.base import ToolInfraError
from memrl.tools.cgroup import CallCgroup, CgroupFactory
from memrl.tools.config import SandboxConfig

log = logging.getLogger(__name__)

BWRAP = "/usr/bin/bwrap"
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

_BOOTSTRAP = """\
import os as _o, resource as _r, sys as _s
for _k, _v in {limits!r}:
    _r.setrlimit(_k, (_v, _v))
_o.write({ready_fd}, b"R")  # the interpreter is up and limited: what follows is the user's doing
_o.close({ready_fd})
_src = _s.stdin.buffer.read()
_s.stdin.close()
_s.argv = ["<sandbox>"]
_s.path[:0] = {python_path!r}
__builtins__.exit = __builtins__.quit = _s.exit  # normally added by `site`, which -S skips
del _o, _r, _k, _v
_g = {{"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None}}
try:
    exec(compile(_src, "<sandbox>", "exec"), _g)
except SystemExit:
    raise
except BaseException as _e:
    import linecache as _l, traceback as _t
    _txt = _src.decode("utf-8", "replace")
    _l.cache["<sandbox>"] = (len(_txt), None, _txt.splitlines(True), "<sandbox>")
    _t.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    _s.stderr.flush()
    _s.exit(1)
"""


def bootstrap(cfg: SandboxConfig, ready_fd: int, nproc: int | None = None) -> str:
    limits = [
        (resource.RLIMIT_CPU, cfg.cpu_s),
        (resource.RLIMIT_AS, cfg.memory_mb << 20),
        (resource.RLIMIT_NPROC, nproc or cfg.max_processes),
        (resource.RLIMIT_FSIZE, cfg.max_file_mb << 20),
        (resource.RLIMIT_NOFILE, cfg.max_open_files),
        (resource.RLIMIT_CORE, 0),
    ]
    return _BOOTSTRAP.format(limits=limits, ready_fd=ready_fd, python_path=list(cfg.python_path))


def python_argv(cfg: SandboxConfig, ready_fd: int, nproc: int | None = None) -> list[str]:
    # -I: isolated (no env vars, no user site, no cwd on sys.path); -S: no site import (faster start);
    # -u: unbuffered, so what was printed before a kill is still seen; -B: no .pyc writes.
    return [cfg.python, "-I", "-S", "-u", "-B", "-c", bootstrap(cfg, ready_fd, nproc)]


def code_fd(code: str) -> int:
    """The program as a memfd positioned at 0 (becomes the child's stdin)."""
    fd = os.memfd_create("memrl-code", os.MFD_CLOEXEC)
    os.write(fd, code.encode("utf-8", errors="surrogateescape"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@dataclass
class Spawned:
    proc: subprocess.Popen
    stdout_fd: int
    stderr_fd: int
    ready_fd: int  # read end: the bootstrap writes one byte once the interpreter runs under its limits
    status_fd: int | None = None  # bwrap --json-status-fd read end
    cgroup: CallCgroup | None = None  # the call's memory cgroup (memory_total_mb > 0)
    cleanup: list = field(default_factory=list)  # callables run after the tree is reaped


def _drop_to(cfg: SandboxConfig) -> dict:
    """Popen kwargs that run the launcher as an unprivileged host uid when memrl itself runs as root."""
    if os.geteuid() != 0:
        return {}
    return {"user": cfg.sandbox_uid, "group": cfg.sandbox_uid, "extra_groups": []}


def cgroups_for(cfg: SandboxConfig) -> CgroupFactory | None:
    if cfg.memory_total_mb == 0:
        return None
    return CgroupFactory(
        cfg.memory_total_mb, cfg.sandbox_uid if os.geteuid() == 0 else None, cfg.cgroup_parent
    )


def _popen(
    make_argv: Callable[[int], list[str]],
    cfg: SandboxConfig,
    stdin_fd: int,
    pass_fds: tuple,
    cwd: str,
    env: dict | None = None,
    cgroup: CallCgroup | None = None,
) -> Spawned:
    """Start ``make_argv(ready_fd)`` with fresh pipes; the caller supervises and closes the read ends. With a
    cgroup, a shell moves itself into it and then execs the launcher, so every process of the call is inside."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ready_r, ready_w = os.pipe()
    argv = make_argv(ready_w)
    if cgroup is not None:
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup.procs_file, *argv]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=out_w,
            stderr=err_w,
            pass_fds=(*pass_fds, ready_w),
            env=dict(SANDBOX_ENV) if env is None else env,
            cwd=cwd,
            start_new_session=True,  # own session + process group: the group kill reaches every child
            **_drop_to(cfg),
        )
    except OSError as exc:
        for fd in (out_r, err_r, ready_r):
            os.close(fd)
        raise ToolInfraError(f"cannot start the sandbox ({argv[0]}): {exc}") from exc
    finally:
        for fd in (out_w, err_w, ready_w):
            os.close(fd)
    return Spawned(proc, out_r, err_r, ready_r, cgroup=cgroup)


def _world_readable(path: str) -> bool:
    """Can an unrelated uid (the sandbox's, when memrl runs as root) reach and read ``path``?"""
    p = Path(os.path.realpath(path))
    for parent in reversed(p.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(p).st_mode
    return bool(mode & stat.S_IROTH) and (not p.is_dir() or bool(mode & stat.S_IXOTH))


LAUNCHERS: Registry[type] = Registry("sandbox mode")


@LAUNCHERS.register("bwrap")
class BwrapLauncher:
    """bubblewrap: new user (uid ``sandbox_uid``, no capabilities, no nested user namespaces), pid, net (only a
    down-by-default loopback), ipc, uts and mount namespaces; only ``/usr`` (+ the interpreter's prefix and
    ``ro_binds``) visible, read-only; fresh ``/proc`` of the new pid namespace; size-capped private ``/tmp`` and
    ``/dev/shm``, read-only ``/dev`` with only null/zero/full/random/urandom/tty;
    ``--die-with-parent``; new session (no terminal injection); seccomp deny list.

    ``--as-pid-1``: the interpreter itself is the namespace's init, so bwrap's outer process reaps it with
    ``waitpid`` (with bwrap's own init, the outer process exits on the init's exit *event* and the dying init is
    left to the host's init as a zombie). When it exits, the kernel kills everything else in the namespace.
    Cost: orphans inside are not reaped before the call ends (they count toward ``max_processes``)."""

    def __init__(self, cfg: SandboxConfig) -> None:
        if not (os.path.exists(BWRAP) or shutil.which("bwrap")):
            raise ToolInfraError(
                "bubblewrap is not installed, so model code cannot run isolated. Install it "
                "(`apt-get install bubblewrap`) or set tools.sandbox.mode=rlimit to accept the weak rlimit-only "
                "mode (no filesystem, network or pid isolation)."
            )
        self.cfg = cfg
        self.bwrap = BWRAP if os.path.exists(BWRAP) else str(shutil.which("bwrap"))
        self.filter = seccomp.deny_filter() if cfg.seccomp and seccomp.supported() else None
        if cfg.seccomp and self.filter is None:
            log.warning("seccomp deny list is only built for x86_64; the sandbox runs without it here")
        self.binds = self._bind_paths()
        self.cgroups = cgroups_for(cfg)

    def _bind_paths(self) -> list[str]:
        real = Path(os.path.realpath(self.cfg.python))
        if not real.is_file():
            raise ToolInfraError(f"tools.sandbox.python={self.cfg.python!r} does not exist")
        paths = list(self.cfg.ro_binds)
        prefix = str(real.parent.parent)
        if not (prefix == "/usr" or prefix.startswith("/usr/")):
            paths.append(prefix)
        for p in paths:
            if not os.path.exists(p):
                raise ToolInfraError(f"tools.sandbox.ro_binds entry {p!r} does not exist")
            if os.geteuid() == 0 and not _world_readable(p):
                raise ToolInfraError(
                    f"{p!r} must be bound into the sandbox but uid {self.cfg.sandbox_uid} cannot read it (a parent "
                    "directory lacks o+x or the path lacks o+r). Use an interpreter under /usr (the default "
                    "/usr/bin/python3) or a world-readable prefix; memrl never runs the sandbox as root."
                )
        return paths

    def _fs_args(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = f"/{name}"
            if os.path.islink(host):  # merged-/usr layouts: keep the symlink
                args += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                args += ["--ro-bind", host, host]
        for path in ("/etc/ld.so.cache", "/etc/localtime"):
            args += ["--ro-bind-try", path, path]
        for path in self.binds:
            args += ["--ro-bind", path, path]
        size = str(self.cfg.tmp_mb << 20)
        # bwrap's /dev is an unbounded tmpfs: give /dev/shm its own capped tmpfs and make /dev itself read-only.
        args += ["--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        args += ["--proc", "/proc", "--size", size, "--tmpfs", "/tmp"]
        return args + ["--remount-ro", "/", "--chdir", "/tmp"]

    def spawn(self, code: str) -> Spawned:
        uid = str(self.cfg.sandbox_uid if os.geteuid() == 0 else os.getuid())
        fds: list[int] = []
        status_r, status_w = os.pipe()
        stdin_fd = code_fd(code)
        try:
            argv = [self.bwrap, "--unshare-all", "--unshare-user", "--uid", uid, "--gid", uid]
            argv += [
                "--disable-userns",
                "--die-with-parent",
                "--new-session",
                "--cap-drop",
                "ALL",
                "--as-pid-1",
            ]
            argv += self._fs_args()
            argv += ["--clearenv", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
            for k, v in SANDBOX_ENV.items():
                argv += ["--setenv", k, v]
            argv += ["--json-status-fd", str(status_w)]
            if self.filter is not None:
                sfd = os.memfd_create("memrl-seccomp", os.MFD_CLOEXEC)
                os.write(sfd, self.filter)
                os.lseek(sfd, 0, os.SEEK_SET)
                fds.append(sfd)
                argv += ["--seccomp", str(sfd)]
            argv.append("--")
            cgroup = self.cgroups.create() if self.cgroups is not None else None
            try:
                spawned = _popen(
                    lambda ready: argv + python_argv(self.cfg, ready),
                    self.cfg,
                    stdin_fd,
                    (status_w, *fds),
                    cwd="/",
                    cgroup=cgroup,
                )
            except BaseException:
                if cgroup is not None:
                    cgroup.remove()
                raise
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
            os.close(stdin_fd)
            for fd in fds:
                os.close(fd)
        spawned.status_fd = status_r
        return spawned


@LAUNCHERS.register("rlimit")
class RlimitLauncher:
    """rlimits only (opt-in). Runs as ``sandbox_uid`` when memrl is root, in a fresh private working directory
    with an empty environment — but the code CAN read every file that uid can read, use the network, see host
    processes, and escape the process-group kill with setsid + double fork."""

    WARNING = (
        "tools.sandbox.mode=rlimit: model code runs WITHOUT isolation — it can read any file its uid can read, "
        "reach the network, see host processes, and a setsid/double-fork can outlive the timeout. Only "
        "resource limits (CPU, memory, processes, file size, open files) and the wall-clock kill apply. "
        "Install bubblewrap and use mode=bwrap for untrusted code."
    )

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        if not os.path.isfile(os.path.realpath(cfg.python)):
            raise ToolInfraError(f"tools.sandbox.python={cfg.python!r} does not exist")
        self.cgroups = cgroups_for(cfg)
        log.warning(self.WARNING)

    def _nproc(self) -> int:
        """RLIMIT_NPROC counts every process of the uid host-wide; leave room above what it already runs."""
        uid = self.cfg.sandbox_uid if os.geteuid() == 0 else os.getuid()
        running = 0
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    running += entry.stat().st_uid == uid
                except OSError:
                    continue
        return running + self.cfg.max_processes

    def spawn(self, code: str) -> Spawned:
        workdir = tempfile.mkdtemp(prefix="memrl-sandbox-")
        if os.geteuid() == 0:
            os.chown(workdir, self.cfg.sandbox_uid, self.cfg.sandbox_uid)
        stdin_fd = code_fd(code)
        nproc = self._nproc()
        cgroup = self.cgroups.create() if self.cgroups is not None else None
        try:
            env = {**SANDBOX_ENV, "HOME": workdir, "TMPDIR": workdir}
            spawned = _popen(
                lambda ready: python_argv(self.cfg, ready, nproc),
                self.cfg,
                stdin_fd,
                (),
                workdir,
                env,
                cgroup,
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            os.close(stdin_fd)
        spawned.cleanup.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
        return spawned
