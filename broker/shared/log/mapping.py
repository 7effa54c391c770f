"""A shared mapping of a file that holds no descriptor once made.

Python's `mmap.mmap` keeps a `dup` of the file's descriptor for as long as the mapping lives
(before Python 3.13's `trackfd=False`), so a mapped state file per partition would cost a
descriptor per partition per process however the files themselves are opened.  `Mapping`
calls mmap(2) through ctypes instead: the caller opens the file, maps it, and closes its
descriptor at once; the pages stay shared with every other process mapping the file.

The words are reached through `words`, a memoryview cast to signed 64-bit integers (aligned
8-byte loads and stores, as mmap's own views).  `close()` releases that view before unmapping,
so a holder of a stale reference gets ValueError ("released memoryview"), never a fault.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MAP_FAILED = ctypes.c_void_p(-1).value
_MS_SYNC = 4  # Linux's value


class Mapping:
    """`size` bytes of the file open at `fd`, shared (MAP_SHARED), read and write."""

    __slots__ = ("size", "words", "_address")

    def __init__(self, fd: int, size: int):
        if size <= 0 or size % 8:
            raise ValueError(f"a mapping of whole 64-bit words needs a positive size that "
                             f"is a multiple of 8, got {size}")
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                             fd, 0)
        if address == _MAP_FAILED or address is None:
            error = ctypes.get_errno()
            raise OSError(error, f"mmap: {os.strerror(error)}")
        self._address = address
        self.size = size
        raw = (ctypes.c_char * size).from_address(address)
        self.words = memoryview(raw).cast("B").cast("q")

    def flush(self) -> None:
        """msync: the pages written to the file before this returns."""
        if self._address and _libc.msync(self._address, self.size, _MS_SYNC) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"msync: {os.strerror(error)}")

    def close(self) -> None:
        if not self._address:
            return
        self.words.release()  # BufferError while a view exported from it lives: kept mapped
        _libc.munmap(self._address, self.size)
        self._address = 0


def map_file(path: str, size: int, create: bool = False) -> Mapping:
    """Map the first `size` bytes of `path` (grown to that size if shorter); the descriptor
    used to map it is closed before this returns."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        return Mapping(fd, size)
    finally:
        os.close(fd)
