"""convert/stored_tensor.py: a tensor saved by ``torch.save`` inside a larger file is memory-mapped with its
values, shape, strides and storage offset; every item it cannot map (big-endian, compressed, not a plain tensor)
gives None, so the export falls back to the ordinary load instead of reading wrong bytes."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from mtmegatron.convert.stored_tensor import _Slice, map_saved_tensor

PAD_BEFORE, PAD_AFTER = b"\x01" * 4099, b"\x02" * 77   # the item starts off any page boundary, as in a .distcp


def saved_bytes(obj, crc: bool = True) -> bytes:
    """``torch.save`` of ``obj``; ``crc=False`` as the converter's workers write (no CRC-32 computed)."""
    from torch.utils.serialization import config

    buf = io.BytesIO()
    with config.patch({"save.compute_crc32": crc}):
        torch.save(obj, buf)
    return buf.getvalue()


def rewritten(item: bytes, byteorder: bytes | None = None, compress_data: bool = False) -> bytes:
    """The archive ``item`` re-zipped with another byteorder record and/or its storage records deflated."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(item)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if byteorder is not None and info.filename.endswith("/byteorder"):
                data = byteorder
            deflate = compress_data and "/data/" in info.filename
            dst.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)
    return out.getvalue()


def mapped(tmp_path, item: bytes):
    path = tmp_path / "file.distcp"
    path.write_bytes(PAD_BEFORE + item + PAD_AFTER)
    return map_saved_tensor(str(path), len(PAD_BEFORE), len(item))


@pytest.mark.parametrize("crc", [True, False], ids=["crc", "no-crc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64])
def test_plain_items_map_with_their_values(tmp_path, dtype, crc):
    whole = torch.arange(6 * 7, dtype=torch.float64).reshape(6, 7).to(dtype)
    item = saved_bytes(whole, crc)
    got = mapped(tmp_path, item)
    assert got is not None and got.dtype == dtype and torch.equal(got, whole)
    assert torch.equal(torch.load(io.BytesIO(item)), whole)     # torch.load does not check the CRC either
    view = whole.t()[2:5]                                        # strides and a storage offset, not contiguous
    got = mapped(tmp_path, saved_bytes(view, crc))
    assert got is not None and got.stride() == view.stride() and torch.equal(got, view)
    empty = mapped(tmp_path, saved_bytes(torch.empty(0, 3, dtype=dtype), crc))
    assert empty is not None and empty.shape == (0, 3)


def test_items_it_cannot_map_give_none(tmp_path):
    item = saved_bytes(torch.arange(10, dtype=torch.float32))
    assert mapped(tmp_path, rewritten(item)) is not None     # the re-zipping itself keeps an item mappable
    assert mapped(tmp_path, rewritten(item, byteorder=b"big")) is None
    compressed = rewritten(item, compress_data=True)
    assert mapped(tmp_path, compressed) is None
    assert torch.equal(torch.load(io.BytesIO(compressed)), torch.arange(10, dtype=torch.float32))  # the fallback
    assert mapped(tmp_path, saved_bytes({"w": torch.ones(2)})) is None            # not one plain tensor
    assert mapped(tmp_path, saved_bytes([torch.ones(2)])) is None
    assert mapped(tmp_path, b"not a zip archive at all") is None


def test_the_slice_is_what_zipfile_needs_and_torchs_view_is_not(tmp_path):
    from torch.distributed.checkpoint.utils import _create_file_view

    item = saved_bytes(torch.ones(3))
    path = tmp_path / "file.distcp"
    path.write_bytes(PAD_BEFORE + item + PAD_AFTER)
    with open(path, "rb") as f:
        assert any(n.endswith("/data.pkl") for n in zipfile.ZipFile(_Slice(f, len(PAD_BEFORE), len(item))).namelist())
        with pytest.raises((ValueError, zipfile.BadZipFile)):   # if torch's view learns SEEK_END, use it instead
            zipfile.ZipFile(_create_file_view(f, len(PAD_BEFORE), len(item)))
