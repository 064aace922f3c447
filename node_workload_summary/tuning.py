"""The process's memory and TLS reads, tuned once at start (beside gcfreeze.py, the collector's):
glibc's mmap threshold pinned, and asyncio's TLS reads sized under it."""

from __future__ import annotations

import ctypes
import os
from asyncio import sslproto

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value
TLS_READ_SIZE = 64 * 1024  # below MMAP_THRESHOLD: see size_tls_reads


def pin_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold at its initial 128 KiB. glibc raises it to the size of any
    larger block freed (a LIST page of a few MB), and from then on transient buffers up to that
    size come from the brk heap: under pod churn the heap fragments and RSS creeps (about 100
    bytes per replaced pod) while the Python objects stay flat. Setting it also stops the raising.
    False without glibc, or where MALLOC_MMAP_THRESHOLD_ already decides."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def size_tls_reads() -> None:
    """Read TLS records into 64 KiB buffers, not asyncio's 256 KiB. asyncio's TLS layer reads into a
    new bytes object of ``SSLProtocol.max_size`` at every call, at least twice per watch event (the
    last call finds no data), and above the pinned mmap threshold each of those buffers is an mmap
    and a munmap, or a heap trim: 33 µs of TLS per 2.4 KB event instead of 5 (docs/benchmarks.md). A
    TLS record holds at most 16 KiB of data, so a smaller buffer reads as much per call."""
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_SIZE:
        sslproto.SSLProtocol.max_size = TLS_READ_SIZE
