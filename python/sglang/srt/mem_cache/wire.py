"""The bytes a shared store holds: a magic tag, a little-endian u32 header length, a JSON header,
then raw tensor bytes. The header names each tensor's dtype and shape and the payload's digest;
the reader checks all of it and unpickles nothing. The embedding store and the KV page store
frame their entries this way; each adds its own header fields and checks them.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import torch

_HEADER_LEN = struct.Struct("<I")
MAX_HEADER_BYTES = 1 << 16
WIRE_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
DTYPE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}


class InvalidEntry(ValueError):
    """An entry that is not what the reader expects (corrupt, truncated, foreign)."""


def digest(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def pack(magic: bytes, fields: dict[str, Any], tensors: list[torch.Tensor]) -> bytes:
    """``tensors`` framed under ``magic`` with ``fields`` in the header."""
    tensors = [t.detach().contiguous().cpu() for t in tensors]
    for t in tensors:
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensors travel as {sorted(WIRE_DTYPES)}, not {t.dtype}")
    payload = b"".join(t.view(torch.uint8).numpy().tobytes() for t in tensors)
    header = json.dumps(
        {
            **fields,
            "tensors": [{"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)} for t in tensors],
            "digest": digest(payload),
        }
    ).encode()
    return magic + _HEADER_LEN.pack(len(header)) + header + payload


def unpack(
    data: bytes, magic: bytes, max_tensors: int = 1 << 12
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The header and the tensors of ``data``; raises ``InvalidEntry`` on a wrong tag, a
    truncated or unreadable header, a payload of the wrong size or digest. The tensors own their
    storage."""
    prefix = len(magic) + _HEADER_LEN.size
    if len(data) < prefix or not data.startswith(magic):
        raise InvalidEntry("not an entry of this store")
    (header_len,) = _HEADER_LEN.unpack_from(data, len(magic))
    if header_len > MAX_HEADER_BYTES or prefix + header_len > len(data):
        raise InvalidEntry("truncated header")
    try:
        header = json.loads(data[prefix : prefix + header_len])
        specs = [(WIRE_DTYPES[s["dtype"]], [int(d) for d in s["shape"]]) for s in header["tensors"]]
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidEntry(f"unreadable header: {e}") from None
    if not isinstance(header, dict) or len(specs) > max_tensors:
        raise InvalidEntry("unreadable header")
    if any(d < 0 for _, shape in specs for d in shape):
        raise InvalidEntry("negative dimension")
    payload = memoryview(data)[prefix + header_len :]
    sizes = [_numel(shape) * d.itemsize for d, shape in specs]
    if len(payload) != sum(sizes):
        raise InvalidEntry(f"{len(payload)} payload bytes, the header needs {sum(sizes)}")
    if header.get("digest") != digest(payload):
        raise InvalidEntry("payload digest mismatch")
    tensors, offset = [], 0
    for (d, shape), size in zip(specs, sizes):
        if size:
            flat = torch.frombuffer(bytearray(payload[offset : offset + size]), dtype=torch.uint8)
        else:
            flat = torch.empty(0, dtype=torch.uint8)
        tensors.append(flat.view(d).reshape(shape))
        offset += size
    return header, tensors


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
