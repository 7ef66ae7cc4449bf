"""Config of the tool layer and the python sandbox (owned by memrl.tools)."""

from __future__ import annotations

from dataclasses import dataclass, field

SANDBOX_MODES = ("bwrap", "rlimit")


def _positive(obj: object, names: tuple[str, ...], where: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"{where}.{name} must be > 0 (got {value!r})")


@dataclass
class SandboxConfig:
    """Limits for model-written python. Every limit applies per call.

    ``mode``: ``bwrap`` (bubblewrap: own user/pid/net/ipc/uts/mount namespaces, read-only system dirs, private
    tmpfs /tmp, seccomp, no capabilities) or ``rlimit`` (resource limits only — weak isolation, opt-in).
    ``memory_mb`` caps the address space of each process; with ``max_processes`` processes the worst case is
    their product — unless ``memory_total_mb`` puts each call in its own memory cgroup (see
    :mod:`memrl.tools.cgroup`).
    """

    mode: str = "bwrap"
    python: str = "/usr/bin/python3"  # interpreter inside the sandbox; its prefix is bound read-only
    timeout_s: float = 5.0  # wall clock, then the whole process tree is SIGKILLed
    cpu_s: int = 5  # RLIMIT_CPU per process
    memory_mb: int = 512  # RLIMIT_AS per process
    max_processes: int = 16  # RLIMIT_NPROC (counted inside the sandbox's own user namespace)
    max_file_mb: int = 16  # RLIMIT_FSIZE
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmp_mb: int = 32  # size of the private tmpfs /tmp
    concurrency: int = 2  # sandboxes running at once (the pool)
    capture_bytes: int = 32768  # kept per stream while reading: first half + last half, the rest counted
    max_stream_bytes: int = 8 << 20  # total output past which the call is killed (killed_reason=output_limit)
    memory_total_mb: int = 0  # cgroup memory limit of the whole call (all processes); 0 = rlimits only
    cgroup_parent: str = ""  # cgroup v2: delegated dir with +memory in subtree_control (v1 is found alone)
    sandbox_uid: int = 65534  # host uid the sandbox runs as when memrl runs as root (never root itself)
    seccomp: bool = True  # deny ptrace, mount, keyctl, bpf, perf_event_open, ... (x86_64)
    ro_binds: list[str] = field(default_factory=list)  # extra host paths bound read-only (e.g. site-packages)
    python_path: list[str] = field(default_factory=list)  # prepended to sys.path inside (e.g. those binds)

    def __post_init__(self) -> None:
        if self.mode not in SANDBOX_MODES:
            raise ValueError(
                f"tools.sandbox.mode={self.mode!r} is unknown; valid: {', '.join(SANDBOX_MODES)} "
                "(rlimit is the weak opt-in mode for hosts without bubblewrap)"
            )
        _positive(
            self,
            (
                "timeout_s",
                "cpu_s",
                "memory_mb",
                "max_processes",
                "max_file_mb",
                "max_open_files",
                "tmp_mb",
                "concurrency",
                "capture_bytes",
                "max_stream_bytes",
            ),
            "tools.sandbox",
        )
        if self.memory_mb < 64:
            raise ValueError(
                f"tools.sandbox.memory_mb={self.memory_mb} is too small for a Python interpreter; use >= 64"
            )
        if self.max_open_files < 8:
            raise ValueError(f"tools.sandbox.max_open_files={self.max_open_files}: python needs >= 8")
        if self.capture_bytes > self.max_stream_bytes:
            raise ValueError("tools.sandbox.capture_bytes must be <= tools.sandbox.max_stream_bytes")
        if self.memory_total_mb < 0:
            raise ValueError("tools.sandbox.memory_total_mb must be >= 0 (0 turns the per-call cgroup off)")
        if self.sandbox_uid == 0:
            raise ValueError("tools.sandbox.sandbox_uid must not be 0: the sandbox never runs as root")


@dataclass
class ToolsConfig:
    """``enabled`` tools by registry name (the call syntax is the rollout's: ``rollout.tool_parser``).

    ``max_output_chars`` bounds the observation fed back to the model (head and tail kept, marker between).
    ``neutralize`` lists extra literal strings (e.g. a tokenizer's special tokens) escaped in tool output so
    that code cannot forge ``</result>`` or chat-template tokens; the built-in list covers our tags and the
    common ``<|...|>`` / ``</s>`` forms.
    """

    enabled: list[str] = field(default_factory=lambda: ["python", "search"])
    max_output_chars: int = 1024
    max_parallel: int = 8  # calls in flight in the executor (python calls additionally wait for the pool)
    max_infra_retries: int = 2  # a call whose infrastructure fails (not its code) is retried with backoff
    search_k: int = 5  # facts returned by the search tool
    neutralize: list[str] = field(default_factory=list)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        if self.max_output_chars < 64:
            raise ValueError(
                f"tools.max_output_chars={self.max_output_chars} leaves no room for head+tail; use >= 64"
            )
        _positive(self, ("max_parallel", "search_k"), "tools")
        if self.max_infra_retries < 0:
            raise ValueError(
                f"tools.max_infra_retries must be >= 0 (0 = never retry), got {self.max_infra_retries}"
            )
        if len(set(self.enabled)) != len(self.enabled):
            raise ValueError(f"tools.enabled lists a tool twice: {self.enabled}")
