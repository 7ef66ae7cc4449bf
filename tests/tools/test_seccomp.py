"""The hand-assembled seccomp deny list: well-formed program, and it really answers EPERM inside the sandbox."""

from __future__ import annotations

import struct

import pytest

from memrl.tools import Sandbox, seccomp
from tests.tools.support import needs_bwrap, small_config

pytestmark = pytest.mark.skipif(not seccomp.supported(), reason="filter is assembled for x86_64 only")


def test_program_shape():
    prog = seccomp.deny_filter()
    n = len(set(seccomp.DENIED_X86_64.values()))
    assert len(prog) == 8 * (6 + 2 * n + 1)
    first = struct.unpack("=HBBI", prog[:8])
    last = struct.unpack("=HBBI", prog[-8:])
    assert first == (0x20, 0, 0, 4)  # load arch
    assert last == (0x06, 0, 0, 0x7FFF0000)  # default: allow


PROBE = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "rc = libc.syscall(250, 0, 0, 0, 0, 0)  # keyctl(KEYCTL_GET_KEYRING_ID, ...)\n"
    "print(rc, os.strerror(ctypes.get_errno()))"
)


@needs_bwrap
def test_denied_syscall_gets_eperm_only_with_the_filter():
    with Sandbox(small_config(seccomp=True)) as on, Sandbox(small_config(seccomp=False)) as off:
        with_filter, without = on.run(PROBE), off.run(PROBE)
    assert with_filter.stdout == "-1 Operation not permitted\n"
    assert without.stdout != with_filter.stdout  # the namespaces alone answer differently
