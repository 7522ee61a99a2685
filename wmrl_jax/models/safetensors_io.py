"""Minimal safetensors reader and writer on numpy memory maps.

The format (https://huggingface.co/docs/safetensors) is an 8-byte little-endian
header length, a JSON header mapping each tensor name to its dtype, shape and
byte range, and the raw little-endian data. Reading through `np.memmap` lets a
caller copy only the slice each device needs; bfloat16 comes from `ml_dtypes`.
"""

import json
import os
import struct
from collections.abc import Mapping

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the byte offset of its data."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", prefix)
        header = json.loads(f.read(n))
    return header, 8 + n


def open_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Memory-mapped, read-only views of every tensor in a safetensors file."""
    header, start = read_header(path)
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        dtype = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r} byte range does not match its shape")
        if count == 0:
            out[name] = np.zeros(shape, dtype)
            continue
        out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
    return out


def read_metadata(path: str | os.PathLike) -> dict | None:
    """The `__metadata__` entry of a safetensors header, if any."""
    return read_header(path)[0].get("__metadata__")


def write_tensors(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> int:
    """Writes numpy arrays to a safetensors file; returns the bytes of tensor data.

    Tensors are laid out in name order; the header is padded with spaces to a
    multiple of 8 bytes so that every tensor is aligned.
    """
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {arr.dtype}")
        header[name] = {
            "dtype": DTYPE_NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    return offset
