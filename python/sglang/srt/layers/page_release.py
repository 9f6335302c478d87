"""Giving memory back: the pages of weights nothing reads again (a checkpoint's file pages once
a weight is converted, a packed weight's source rows), and casts that never hold a source and its
copy whole at once. Linux only (``madvise``, ``/proc/self/maps``)."""

from __future__ import annotations

import ctypes
import functools
import mmap

import torch

MADV_DONTNEED = 4


def release_file_pages(tensor: torch.Tensor) -> bool:
    """Drop from this process's resident set the whole pages ``tensor`` views in a private
    mapping of a safetensors file (safetensors maps files copy-on-write and nothing writes a
    checkpoint's tensors, so a later read faults the same bytes in from the file); returns
    whether it did. Memory of any other kind is left alone."""
    return on_checkpoint_mapping(tensor) and drop_pages(tensor)


def drop_pages(tensor: torch.Tensor) -> bool:
    """Give the whole pages of a contiguous CPU ``tensor`` back to the system
    (``MADV_DONTNEED``): for memory nothing reads again. Anonymous pages read back as zeros, a
    private file mapping's as the file's bytes. Returns whether any page went."""
    if tensor.device.type != "cpu" or tensor.numel() == 0 or not tensor.is_contiguous():
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.itemsize
    low, high = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if high <= low:
        return False
    return _libc().madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) == 0


def cast_releasing(
    source: torch.Tensor, dtype: torch.dtype, slice_bytes: int = 64 << 20
) -> torch.Tensor:
    """A copy of ``source`` in ``dtype``; for a tensor on a safetensors mapping, made
    ``slice_bytes`` of the source at a time, each slice's pages released once copied: the
    source's pages and the copy are never both resident beyond one slice (casting a 1 GiB
    float16 head at once would hold both, 2 GiB)."""
    if not source.is_contiguous() or not on_checkpoint_mapping(source):
        return source.to(dtype, copy=True)
    target = torch.empty(source.shape, dtype=dtype)
    flat, out = source.view(-1), target.view(-1)
    step = max(1, slice_bytes // source.itemsize)
    for first in range(0, flat.numel(), step):  # on the mapping, as the whole source is
        out[first : first + step].copy_(flat[first : first + step])
        drop_pages(flat[first : first + step])
    drop_pages(source)  # the pages two slices shared
    return target


def on_checkpoint_mapping(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s bytes lie in a private mapping of a safetensors file."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    start = tensor.data_ptr()
    return _in_checkpoint_mapping(start, start + tensor.numel() * tensor.itemsize)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_checkpoint_mapping(start: int, end: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(v, 16) for v in fields[0].split("-"))
            if low <= start and end <= high:
                path = fields[5] if len(fields) > 5 else ""
                return fields[1].endswith("p") and path.endswith(".safetensors")
    return False
