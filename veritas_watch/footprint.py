"""This process's memory: how much is resident, and giving back what is only a cache (a leaf module).

The daemon's memory budget (`store.memory_budget_mb`, the sink's upkeep) reads `footprint()`; its release
(the embedded store's `release_memory()`, the models' mapped files) uses `drop_mapped_pages` and
`release_freed_heap`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Footprint:
    """This process's resident memory, MB: all of it, and the part backed by files (mapped store files,
    model files, libraries), which the kernel can take back and a store release can drop."""

    resident: float = 0.0
    file_backed: float = 0.0

    @property
    def anonymous(self) -> float:
        return self.resident - self.file_backed


def footprint() -> Footprint:
    try:
        with open("/proc/self/statm") as statm:
            fields = statm.read().split()
        page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
        return Footprint(int(fields[1]) * page_mb, int(fields[2]) * page_mb)
    except (OSError, ValueError, IndexError):
        return Footprint()


def rss_mb() -> float:
    """Resident memory of this process (anonymous and mapped files), MB."""
    return footprint().resident


_MADV_DONTNEED = 4  # <sys/mman.h>, the same on every Linux architecture


def _shared_file_mappings(directory: Path, table: str) -> Iterator[tuple[int, int, list[str]]]:
    """(start, end, the lines under the header) of this process's shared mappings of files under `directory`,
    read from /proc/self/<table> (`maps`: headers only, cheap; `smaps`: with each mapping's page counts)."""
    prefix = str(directory.resolve()) + "/"
    try:
        with open(f"/proc/self/{table}") as source:
            lines = source.read().splitlines()
    except OSError:
        return
    current: tuple[int, int, list[str]] | None = None
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            if current is not None:
                yield current
            current = None
            if len(head) == 6 and head[1][3:4] == "s" and head[5].startswith(prefix):
                start, end = (int(part, 16) for part in head[0].split("-"))
                current = (start, end, [])
        elif current is not None:
            current[2].append(line)
    if current is not None:
        yield current


def resident_in_mappings(directory: Path) -> int:
    """Bytes of this process's shared mappings of files under `directory` that are resident (from smaps:
    it walks every page table, ~0.1 s with a 100k-point store, so for measuring, not for the hot path)."""
    total = 0
    for _, _, details in _shared_file_mappings(directory, "smaps"):
        total += sum(int(line.split()[1]) * 1024 for line in details if line.startswith("Rss:"))
    return total


def drop_mapped_pages(directory: Path) -> int:
    """Unmap the pages of this process's *shared* mappings of files under `directory`; address ranges advised.

    The engine memory-maps the on-disk vectors, payload and sparse index, and every page a search touches
    stays counted in the process's RSS. MADV_DONTNEED on a shared file mapping only drops the page-table
    entries: the pages stay in the kernel's page cache (the next read is a minor fault, no disk I/O) and
    their contents come back from the file, written changes included (madvise(2)). Private mappings are
    left alone: there it would discard changes. A few milliseconds (the mapping list, then one call per range
    of touching mappings), no reopen, no GIL held while the kernel works.

    Only from the thread that opens, writes and closes the store: the list is read first and used after, and a
    mapping the engine dropped in between could be anonymous memory by then, which MADV_DONTNEED would zero.
    """
    libc = _libc()
    if libc is None:
        return 0
    return sum(libc.madvise(start, end - start, _MADV_DONTNEED) == 0
               for start, end in _contiguous(_shared_file_mappings(directory, "maps")))


def _contiguous(mappings: Iterator[tuple[int, int, list[str]]]) -> list[tuple[int, int]]:
    """Mappings that touch merged into one range: the engine maps its files one after another, so a 100k-point
    store's 744 mappings are 42 ranges. Each call lets go of the GIL and waits to take it back: 744 of them
    took 90-100 ms beside a searching thread, where the same pages are dropped in a few."""
    ranges: list[tuple[int, int]] = []
    for start, end, _ in sorted(mappings):
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def release_freed_heap() -> None:
    """Give the heap freed since (an optimization's buffers, a closed shard) back to the OS (glibc's malloc_trim;
    the embedded engine allocates with it too)."""
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):  # not glibc
            libc.malloc_trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once (`find_library` runs ldconfig: a release may come every 0.25 s)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc
