"""A tensor that ``torch.save`` wrote into a byte range of a file (one item of a torch ``dist_checkpointing``
``.distcp`` file), memory-mapped read-only instead of loaded: ``torch.load`` of such an item copies its bytes
through Python reads into a fresh tensor, which cost the streaming ``mcore-to-hf`` (convert/streaming_export.py)
about as much time as the whole write. Here the zip directory and the pickle of the item are read (a few KB),
and the storage record is mapped where it lies in the file.

May assume: the item is torch's zip serialization of one plain tensor (little-endian, stored uncompressed, as
``torch.save`` writes it); anything else gives None and the caller loads it the ordinary way.
"""

from __future__ import annotations

import mmap
import pickle
import struct
import zipfile

import io
import os

import torch


class _Slice(io.RawIOBase):
    """Bytes ``[offset, offset + length)`` of an open file as a seekable read-only file (what ``zipfile`` needs).
    torch's own file view (``torch.distributed.checkpoint.utils._create_file_view``, what ``FileSystemReader``
    hands ``torch.load``) does not do here: it counts ``SEEK_END`` offsets the other way round, and ``zipfile``
    finds the archive's directory with ``seek(-n, SEEK_END)`` (tests/convert/test_stored_tensor.py)."""

    def __init__(self, file, offset: int, length: int):
        super().__init__()
        self.file, self.offset, self.length, self.pos = file, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = min(max(0, base + pos), self.length)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.length - self.pos))
        got = os.preadv(self.file.fileno(), [memoryview(buffer)[:n]], self.offset + self.pos) if n else 0
        self.pos += got
        return got


class _TensorRecipe(pickle.Unpickler):
    """Reads the pickle of one saved tensor without building it: (storage key, dtype, offset, size, stride)."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: (storage, offset, tuple(size), tuple(stride))
        if (module, name) == ("collections", "OrderedDict"):
            import collections

            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain saved tensor")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, _numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(kind)
        dtype = storage_type._dtype if hasattr(storage_type, "_dtype") else storage_type.dtype
        return key, dtype


def _data_start(f, offset: int, record: zipfile.ZipInfo) -> int:
    """Absolute position in ``f`` of the bytes of ``record`` (a member of the archive at ``offset``)."""
    f.seek(offset + record.header_offset)
    header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return offset + record.header_offset + 30 + name_len + extra_len


def _stored_bytes(f, offset: int, record: zipfile.ZipInfo) -> bytes:
    """The bytes of an uncompressed member, read where they lie: not through ``zipfile``, which checks the CRC-32
    that the converter's workers do not compute (convert/streaming.py; torch.load does not check it either)."""
    if record.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{record.filename} is compressed")
    f.seek(_data_start(f, offset, record))
    return f.read(record.file_size)


def map_saved_tensor(path: str, offset: int, length: int) -> torch.Tensor | None:
    """The tensor saved at ``path[offset:offset + length]``, backed by a read-only private mapping of its bytes
    (None if the item is not a plain little-endian uncompressed tensor)."""
    with open(path, "rb") as f:
        view = _Slice(f, offset, length)
        try:
            archive = zipfile.ZipFile(view)
            names = archive.namelist()
            pkl = next(n for n in names if n.endswith("/data.pkl"))
            order = next((n for n in names if n.endswith("/byteorder")), None)
            if order is not None and _stored_bytes(f, offset, archive.getinfo(order)) != b"little":
                return None
            recipe = _TensorRecipe(io.BytesIO(_stored_bytes(f, offset, archive.getinfo(pkl)))).load()
            if not (isinstance(recipe, tuple) and len(recipe) == 4 and isinstance(recipe[0], tuple)):
                return None
            (key, dtype), storage_offset, size, stride = recipe
            record = archive.getinfo(next(n for n in names if n.endswith(f"/data/{key}")))
            if record.compress_type != zipfile.ZIP_STORED:
                return None
            start = _data_start(f, offset, record)
        except (zipfile.BadZipFile, pickle.UnpicklingError, StopIteration, KeyError, ValueError, struct.error):
            return None
        nbytes = record.file_size
        if nbytes == 0:
            return torch.empty(size, dtype=dtype).as_strided(size, stride, storage_offset)
        aligned = start - start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(f.fileno(), start - aligned + nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ,
                           offset=aligned)
    itemsize = torch.empty((), dtype=dtype).element_size()
    import warnings

    with warnings.catch_warnings():  # the mapping is read-only; nothing writes through the tensor
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=start - aligned)
    return flat.view(dtype)[: nbytes // itemsize].as_strided(size, stride, storage_offset)
