"""A small seccomp-BPF deny list for the sandbox, assembled by hand (no libseccomp needed).

bubblewrap loads it with ``--seccomp FD`` (it also sets ``no_new_privs``). The filter kills the process for a
foreign syscall ABI (i386 ``int 0x80`` and x32 tricks bypass per-number rules) and answers ``EPERM`` to calls
that sandboxed code has no business making: debugging other processes, mounting, kernel keyrings, BPF, perf,
io_uring, module loading. Everything else is allowed — the namespaces and rlimits do the rest.
"""

from __future__ import annotations

import errno
import platform
import struct

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data { int nr; __u32 arch; ... }

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED_X86_64 = {
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "pidfd_getfd": 438,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "unshare": 272,
    "setns": 308,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "personality": 135,
    "acct": 163,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "syslog": 103,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "quotactl": 179,
    "iopl": 172,
    "ioperm": 173,
    "vhangup": 153,
    "uselib": 134,
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def supported() -> bool:
    return platform.machine() == "x86_64"


def deny_filter(denied: dict[str, int] | None = None) -> bytes:
    """The raw ``struct sock_filter[]`` program bwrap expects on its ``--seccomp`` fd (x86_64 only)."""
    if not supported():
        raise NotImplementedError(f"seccomp filter is only assembled for x86_64, not {platform.machine()}")
    numbers = sorted(set((denied or DENIED_X86_64).values()))
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),  # right ABI: skip the kill
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JGE_K, 0, 1, _X32_SYSCALL_BIT),  # x32 numbers: kill
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
    ]
    for nr in numbers:
        prog.append(_insn(_JEQ_K, 0, 1, nr))
        prog.append(_insn(_RET_K, 0, 0, eperm))
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(prog)
