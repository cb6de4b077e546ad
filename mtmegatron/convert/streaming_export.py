"""Streaming ``mcore-to-hf``: a megatron-core ``torch_dist`` checkpoint (converter output or a pretrain ``--save``
checkpoint, with or without optimizer state) -> HF safetensors shards, without ever building the model, in N
worker processes, in memory bounded by a few tensors per worker.

How: the model is built on the *meta* device (convert/streaming.py: ``plan_chunks``) for the checkpoint keys,
global shapes and chunk offsets of every parameter under TP1; the checkpoint's own DCP ``.metadata`` gives the
stored dtype of each key. The way back is mapping.hf_groups (one layer's fused q/k/v, one fc1, one expert ...):
run once on meta tensors it gives every HF tensor's name, shape and dtype, so each safetensors shard's header and
every tensor's byte offset are known before any data is read. The shards are created at their full size with
their headers; each worker then reads its groups one at a time (only the requested model keys;
``create_read_items_for_chunk_list`` reshards from whatever TP/PP/EP layout wrote them: a parameter stored as one
whole item is memory-mapped where it lies in its file (convert/stored_tensor.py), anything else assembled by torch's
``FileSystemReader.read_data``), applies the transform, casts (``--dtype``; default: the stored dtype) and ``pwrite``s each HF tensor at
its offset. The vocabulary rows are read without their padding.
Safety: everything is written under ``<out>.partial.<pid>`` and renamed to ``<out>`` when complete; the finished
marker ``<out>/conversion_complete.json`` exists only in a complete output. Workers stop when the parent dies.
A damaged input is one line naming the file: a ``.metadata`` that does not unpickle, a ``.distcp`` file missing or
shorter than its ``.metadata`` says
(checked before any worker starts), or one whose bytes are not what ``torch.save`` wrote (zero-filled, overwritten:
found when its tensor is read).
Memory per worker: one group's inputs and outputs and one stored chunk being copied (about 2 x the largest
parameter + the interpreter); the parent holds no tensor data.
May assume: run as a plain process on Linux (workers are forked after the imports and the meta model).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import struct
import time
import zipfile

import torch

from mtmegatron.models.families import ConversionError
from mtmegatron.convert.streaming import (MARKER, _VOCAB_ROWS, BytesReporter, _follow, _reset_peak, _vm_hwm_bytes,
                                          exit_with_parent, staged, start_forked, worker_failed)

# what torch.load / zipfile / mmap raise on bytes that are not a saved tensor (a damaged .distcp file)
_DAMAGED = (EOFError, RuntimeError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile, struct.error)
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _is_vocab_rows(name: str) -> bool:
    return any(name == rows or name.endswith("." + rows) for rows in _VOCAB_ROWS)


# ---- reading one parameter ---------------------------------------------------------------------------------
class _Target:
    """The part of a LoadPlanner that ``FileSystemReader.read_data`` calls: every read lands in ``view``."""

    def __init__(self, view: torch.Tensor):
        self.view = view

    def resolve_tensor(self, req):
        from torch.distributed._shard._utils import narrow_tensor_by_index

        return narrow_tensor_by_index(self.view, req.dest_offsets, req.lengths)

    def commit_tensor(self, req, tensor):
        pass


class _Reader:
    """Parameters of the TP1 model read from a torch_dist checkpoint one at a time (the vocabulary rows without
    their padding)."""

    def __init__(self, directory: str, chunks_of: dict, shapes: dict, vocab_size: int):
        from torch.distributed.checkpoint import FileSystemReader

        self.reader = FileSystemReader(directory)
        try:
            self.metadata = self.reader.read_metadata()
        except _DAMAGED as e:  # a truncated or overwritten .metadata (a missing one: the OSError says so)
            raise ConversionError(f"{os.path.join(directory, '.metadata')}: damaged: not the checkpoint index torch's "
                                  f"distributed checkpoint wrote ({type(e).__name__} reading it)") from None
        self.reader.set_up_storage_reader(self.metadata, True)
        self.chunks_of, self.shapes, self.vocab_size = chunks_of, shapes, vocab_size

    def dtype(self, local: str) -> torch.dtype:
        return self.metadata.state_dict_metadata[self.chunks_of[local][0].key].properties.dtype

    def shape(self, local: str) -> tuple:
        shape = self.shapes[local]
        return (self.vocab_size, *shape[1:]) if _is_vocab_rows(local) else shape

    def check(self) -> None:
        """Every chunk's key is in the checkpoint with the global shape the model from the flags has."""
        for local, chunks in self.chunks_of.items():
            for c in chunks:
                md = self.metadata.state_dict_metadata.get(c.key)
                if md is None or not hasattr(md, "chunks"):
                    raise ConversionError(f"the checkpoint has no tensor {c.key} (it was written by a different "
                                          f"model than its flags describe)")
                got, want = tuple(md.size), tuple(c.global_shape)
                if _is_vocab_rows(local):
                    ok = got[1:] == want[1:] and got[0] >= self.vocab_size
                else:
                    ok = got == want
                if not ok:
                    raise ConversionError(f"{c.key}: the checkpoint has shape {got}, the model from its flags "
                                          f"{want} (checkpoint and flags disagree)")

    def check_files(self) -> None:
        """Every file the ``.metadata`` places the model's tensors in is there and long enough for them (a
        truncated or missing ``.distcp`` file: one line naming it, before any worker starts; the optimizer's files
        of a training checkpoint are not read, so not checked)."""
        keys = {c.key for chunks in self.chunks_of.values() for c in chunks}
        ends: dict[str, int] = {}
        for index, info in self.reader.storage_data.items():
            if index.fqn not in keys:
                continue
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
        for name, end in sorted(ends.items()):
            path = os.path.join(str(self.reader.path), name)
            if not os.path.isfile(path):
                raise ConversionError(f"{path}: no such file, but the checkpoint's .metadata places tensor data in "
                                      f"it (an incomplete copy?)")
            size = os.path.getsize(path)
            if size < end:
                raise ConversionError(f"{path}: {size} bytes, but the checkpoint's .metadata places tensor data up "
                                      f"to byte {end} in it (truncated?)")

    def read(self, local: str) -> torch.Tensor:
        """``local`` as stored (module docstring); a stored item that is not what ``torch.save`` wrote (a damaged or
        zero-filled ``.distcp`` file) is one line naming its file."""
        try:
            return self._read(local)
        except ConversionError:
            raise
        except _DAMAGED as e:
            files = sorted({self.reader.storage_data[item.storage_index].relative_path for item in self._items(local)})
            where = ", ".join(os.path.join(str(self.reader.path), f) for f in files)
            raise ConversionError(f"{where}: damaged: the bytes of {self.chunks_of[local][0].key} there are not "
                                  f"a tensor torch.save wrote ({type(e).__name__} reading them)") from None

    def _items(self, local: str) -> list:
        """The DCP read items of ``local`` (whatever layout wrote it)."""
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        items = []
        for c in self.chunks_of[local]:
            shape = (self.vocab_size, *c.shape[1:]) if _is_vocab_rows(local) else c.shape
            sizes = torch.Size((1,) * c.prepend + tuple(shape))
            items += create_read_items_for_chunk_list(c.key, self.metadata.state_dict_metadata[c.key],
                                                      [ChunkStorageMetadata(torch.Size(c.offset), sizes)])
        return items

    def _read(self, local: str) -> torch.Tensor:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        from torch.distributed.checkpoint.planner import LoadPlan
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        whole = self._stored_whole(local)
        if whole is not None:
            return whole
        tensor = torch.empty(self.shape(local), dtype=self.dtype(local))
        for c in self.chunks_of[local]:
            shape = (self.vocab_size, *c.shape[1:]) if _is_vocab_rows(local) else c.shape
            view = tensor.as_strided(shape, c.stride, c.storage_offset)
            for _ in range(c.prepend):
                view = view.unsqueeze(0)
            md = self.metadata.state_dict_metadata[c.key]
            items = create_read_items_for_chunk_list(
                c.key, md, [ChunkStorageMetadata(offsets=torch.Size(c.offset), sizes=view.shape)])
            self.reader.read_data(LoadPlan(items), _Target(view)).wait()
        return tensor


    def _stored_whole(self, local: str) -> torch.Tensor | None:
        """The parameter as stored, when it is one stored item as a whole (converter output and TP1 saves): a view of
        the item's bytes memory-mapped from its file (convert/stored_tensor.py), so no copy is made before the
        write and the page cache pages are written out directly. Else None: ``read`` assembles it with
        ``read_data``."""
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        from mtmegatron.convert.stored_tensor import map_saved_tensor

        (c, *more) = self.chunks_of[local]
        shape = self.shape(local)
        if more or c.storage_offset != 0 or c.shape[1:] != tuple(shape[1:]) or c.stride != torch.empty(
                c.shape, device="meta").stride():
            return None
        sizes = torch.Size((1,) * c.prepend + (shape[0], *c.shape[1:]))
        md = self.metadata.state_dict_metadata[c.key]
        items = create_read_items_for_chunk_list(c.key, md, [ChunkStorageMetadata(torch.Size(c.offset), sizes)])
        info = self.reader.storage_data[items[0].storage_index] if len(items) == 1 else None
        if info is None or getattr(info, "transform_descriptors", None):
            return None
        tensor = map_saved_tensor(os.path.join(str(self.reader.path), info.relative_path), info.offset, info.length)
        if tensor is None:
            return None
        tensor = narrow_tensor_by_index(tensor, items[0].storage_offsets, items[0].lengths)
        return tensor.reshape(shape) if tuple(tensor.shape) == tuple(sizes) else None


# ---- the safetensors layout ----------------------------------------------------------------------------------
def _outputs(groups: list, reader: _Reader, dtype) -> list[list[tuple[str, tuple, torch.dtype]]]:
    """Per group: its HF tensors (name, shape, dtype), from the transforms run on meta tensors."""
    out = []
    for names, transform in groups:
        metas = [torch.empty(reader.shape(n), dtype=reader.dtype(n), device="meta") for n in names]
        out.append([(name, tuple(t.shape), dtype or t.dtype) for name, t in transform(*metas).items()])
    return out


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


def _plan_shards(outputs: list, max_shard_bytes: int, breaks: frozenset = frozenset()
                 ) -> tuple[list[str], dict, list[bytes], list[int]]:
    """(file names, {HF name: (file index, absolute byte offset)}, each file's header bytes, each file's size).
    Tensors in model order, a new shard when the next one would pass ``max_shard_bytes`` and where a group whose
    index is in ``breaks`` begins (the first group of each worker but the first: ``_split``)."""
    shards, current, size = [], [], 0
    for g, j, (name, shape, dtype) in ((g, j, o) for g, group in enumerate(outputs) for j, o in enumerate(group)):
        nbytes = _nbytes(shape, dtype)
        if current and (size + nbytes > max_shard_bytes or (j == 0 and g in breaks)):
            shards.append(current)
            current, size = [], 0
        current.append((name, shape, dtype, nbytes))
        size += nbytes
    shards.append(current)
    files = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    where, headers, sizes = {}, [], []
    for i, shard in enumerate(shards):
        header, begin = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, dtype, nbytes in shard:
            if dtype not in _ST_DTYPES:
                raise ConversionError(f"{name}: dtype {dtype} has no safetensors name here")
            header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [begin, begin + nbytes]}
            begin += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        data_start = 8 + len(text)
        for name, _, _, _ in shard:
            where[name] = (i, data_start + header[name]["data_offsets"][0])
        headers.append(len(text).to_bytes(8, "little") + text)
        sizes.append(data_start + begin)
    return files, where, headers, sizes


def _split(nbytes: list[int], workers: int) -> list[list[int]]:
    """Group indices per worker: contiguous runs in model order, balanced by bytes. Each run then begins a shard
    of its own (``_plan_shards``' ``breaks``), so no two workers write into one file: buffered writes to one file
    serialize on its inode lock (two processes writing one file measured 4.8 GB/s, two files 8.6 GB/s, page
    cache, this box), which left a second worker almost idle below 5 GB (one shard)."""
    total, parts, current, done = sum(nbytes), [], [], 0
    for i, n in enumerate(nbytes):
        target = total * (len(parts) + 1) / workers  # where the current run should end
        if current and len(parts) < workers - 1 and done + n / 2 > target:
            parts.append(current)
            current = []
        current.append(i)
        done += n
    parts.append(current)
    return parts


# ---- the worker ---------------------------------------------------------------------------------------------
def _pwrite_all(fd: int, tensor: torch.Tensor, offset: int, path: str) -> None:
    data = memoryview(tensor.contiguous().view(-1).view(torch.uint8).numpy())
    while len(data):
        try:
            written = os.pwrite(fd, data, offset)
        except OSError as e:  # a full disk: named with the file
            raise OSError(e.errno, e.strerror, path) from None
        data, offset = data[written:], offset + written


def _export_part(index: int, reader: _Reader, groups: list, mine: list[int], staging: str, files: list[str],
                 where: dict, dtype, progress) -> None:
    """Worker (forked): read, transform and write the groups ``mine``; reports bytes, then its VmHWM, or one line
    saying why it failed."""
    exit_with_parent(os.getppid())
    try:
        _export_part_body(index, reader, groups, mine, staging, files, where, dtype, progress)
    except BaseException as e:
        worker_failed(index, progress, e)


def _export_part_body(index, reader, groups, mine, staging, files, where, dtype, progress) -> None:
    torch.set_num_threads(1)
    parent = os.getppid()
    _reset_peak()
    baseline = _vm_hwm_bytes()
    fds = [os.open(os.path.join(staging, f), os.O_WRONLY) for f in files]
    written = BytesReporter(progress)
    for i in mine:
        if os.getppid() != parent:  # the converter was killed: stop instead of writing on as an orphan
            os._exit(3)
        names, transform = groups[i]
        inputs = [reader.read(n) for n in names]
        for name, tensor in transform(*inputs).items():
            if dtype is not None:
                tensor = tensor.to(dtype)
            file, offset = where[name]
            _pwrite_all(fds[file], tensor, offset, os.path.join(staging, files[file]))
            written.add(tensor.numel() * tensor.element_size())
            del tensor
        del inputs
    for fd in fds:
        os.close(fd)
    written.flush()
    progress.put(("done", index, (baseline, _vm_hwm_bytes())))


# ---- the parent ---------------------------------------------------------------------------------------------
def export(load: str, out: str, family: str, flags: list[str], config: dict, rope_interleave: bool,
           workers: int = 1, dtype: torch.dtype | None = None, quiet: bool = False,
           max_shard_bytes: int = 5 * 2**30, hf_layout: dict | None = None, lora_load: str | None = None) -> dict:
    """Write the checkpoint under ``load`` as HF safetensors + ``config`` in ``out`` (atomically); returns stats
    incl. every worker's VmHWM. ``hf_layout``: what mapping.hf_groups needs beyond the flags (LLaVA's).
    ``lora_load``: a LoRA run's adapters, folded into the weights they adapt (convert/lora_merge.py)."""
    from mtmegatron.convert.hf_io import INDEX
    from mtmegatron.convert.mapping import hf_groups
    from mtmegatron.convert.model import init_single_rank, parse_flags
    from mtmegatron.convert.streaming import _meta_model, plan_chunks
    from mtmegatron.utils.checkpoint_dirs import CheckpointError, checkpoint_dir, latest_iteration

    if os.path.exists(out):
        raise ConversionError(f"--out {out} already exists; remove it or choose another directory")
    start = time.time()
    iteration = latest_iteration(load)
    if iteration is None:
        raise CheckpointError(f"{load}: no complete checkpoint (no tracker file)")
    args = parse_flags(list(flags))
    init_single_rank(args)
    chunks, shapes, _ = plan_chunks(_meta_model(args))
    chunks_of: dict[str, list] = {}
    for c in chunks:
        chunks_of.setdefault(c.local, []).append(c)
    reader = _Reader(checkpoint_dir(load, iteration), chunks_of, shapes, args.vocab_size)
    reader.check()
    reader.check_files()
    if lora_load:
        from mtmegatron.convert.lora_merge import merging_reader

        reader = merging_reader(reader, args, lora_load)
    groups = hf_groups(family, args, rope_interleave, hf_layout)
    missing = sorted({n for names, _ in groups for n in names} - set(shapes))
    if missing:
        raise ConversionError(f"the model has no parameter {missing[0]} the HF mapping needs")
    outputs = _outputs(groups, reader, dtype)
    group_bytes = [sum(_nbytes(shape, dt) for _, shape, dt in o) for o in outputs]
    parts = _split(group_bytes, max(1, workers))
    files, where, headers, sizes = _plan_shards(outputs, max_shard_bytes, frozenset(p[0] for p in parts[1:]))
    total = sum(sizes) - sum(len(h) for h in headers)

    root = os.path.abspath(out.rstrip("/"))
    with staged(root) as (staging, workers_started):
        os.makedirs(staging)
        for file, header, size in zip(files, headers, sizes):
            with open(os.path.join(staging, file), "wb") as f:
                f.write(header)
                f.truncate(size)
        # glibc's dynamic mmap threshold would keep freed multi-MB tensors on the heap (see convert/streaming.py)
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))
        ctx = mp.get_context("fork")  # the imports, flags, meta model and checkpoint metadata are inherited
        progress = ctx.Queue()
        procs = [ctx.Process(target=_export_part, daemon=True,
                             args=(i, reader, groups, mine, staging, files, where, dtype, progress))
                 for i, mine in enumerate(parts)]
        setup_seconds = time.time() - start  # flags, meta model, checks, layout: before any tensor is read
        workers_started.extend(procs)
        start_forked(procs)
        hwm = _follow(progress, procs, total, quiet)
        if len(files) > 1:
            with open(os.path.join(staging, INDEX), "w") as f:
                json.dump({"metadata": {"total_size": total},
                           "weight_map": {n: files[i] for n, (i, _) in where.items()}}, f, indent=2)
        with open(os.path.join(staging, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        largest = max(_nbytes(reader.shape(n), reader.dtype(n)) for n in shapes)
        stats = {"bytes": total, "seconds": time.time() - start, "setup_seconds": setup_seconds,
                 "workers": len(parts), "files": files,
                 "worker_vm_hwm_bytes": [h for _, h in hwm], "worker_baseline_vm_hwm_bytes": [b for b, _ in hwm],
                 "parent_vm_hwm_bytes": _vm_hwm_bytes(), "largest_tensor_bytes": largest}
        with open(os.path.join(staging, MARKER), "w") as f:
            json.dump(stats, f, indent=2)
        os.replace(staging, root)
    return stats
