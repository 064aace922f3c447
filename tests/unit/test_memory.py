"""The service keeps glibc from moving transient buffers into the brk heap, where pod churn
fragments it (bench/soak.py measures the RSS this keeps flat)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from asyncio import sslproto

import pytest

from node_workload_summary.tuning import MMAP_THRESHOLD, size_tls_reads

# In a fresh process, with or without pin_mmap_threshold() first (as the service does at start):
# is a 2 MiB block mmapped (returned to the OS when freed) after a large block was freed?
SCRIPT = """
import ctypes
import sys
from node_workload_summary.tuning import pin_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mmapped(size):
    before = libc.mallinfo2().hblkhd
    block = bytearray(size)
    return libc.mallinfo2().hblkhd > before

if sys.argv[1] == "pin":
    assert pin_mmap_threshold()
page = bytearray(8 << 20)  # a LIST page's body, say
del page
print(mmapped(2 << 20))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_freed_large_block_does_not_move_buffers_into_the_heap() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def mmapped(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env,
                              check=True).stdout.strip()

    assert mmapped("default") == "False"  # glibc raised its threshold to 8 MiB: the block came from the heap
    assert mmapped("pin") == "True"


def test_tls_reads_stay_under_the_pinned_mmap_threshold() -> None:
    """asyncio's TLS layer allocates a read buffer of SSLProtocol.max_size at every read (twice per
    watch event); its own 256 KiB, above the pinned threshold, cost 28 µs a watch event in the
    kernel. Still room for the largest TLS record (16 KiB of data)."""
    size_tls_reads()
    assert 16 * 1024 < sslproto.SSLProtocol.max_size < MMAP_THRESHOLD
