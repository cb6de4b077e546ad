"""Streaming ``hf-to-mcore``: HF safetensors -> a megatron-core ``torch_dist`` checkpoint without ever holding the
model, in N worker processes, in memory bounded by a few tensors per worker.

How: the model is built on the *meta* device (no storage, no initialisation) only to ask megatron-core for its
``sharded_state_dict`` under TP1/PP1 — the checkpoint keys, global shapes (layer and expert axes included) and
chunk offsets that ``dist_checkpointing`` writes and reshards from on load (so the output loads under any
TP/PP/EP/VPP layout, like the in-memory converter's). ShardedTensorFactories (SwiGLU's fc1 split into gate and up
chunks) are applied to the meta tensor; each resulting chunk is remembered as a strided view (offset, shape,
stride) of its local parameter. Each worker then writes its share of the chunks with ``torch.distributed.checkpoint``
(its planner, metadata and FileSystemWriter, whose ``write_data`` is replaced by one that writes item by item:
torch's own keeps every written tensor of a file until the file ends) and a planner whose ``resolve_data`` reads
the HF tensors one output at a time (mapping.mcore_sources: QKV interleave, MLA RoPE rows; FP8 blocks dequantized
by hf_io) and hands the chunk over; the writer writes it and drops it before resolving the next. A chunk that is
one input's rows of a row concatenation (SwiGLU fc1's gate and up chunks) is read from that input alone. The megatron-core ShardedObjects (the
linears' empty ``_extra_state``) and the common state are written by megatron-core's own ``dist_checkpointing.save``
as part 0; the parts' DCP metadata are merged into one ``.metadata``.
Safety: everything is written under ``<out>.partial.<pid>`` and renamed to ``<out>`` when complete; the finished
marker ``<out>/conversion_complete.json`` exists only in a complete output. Workers stop when the parent dies.
Memory per worker: the HF inputs of one output tensor and that tensor, or one chunk and its input (measured:
1.03-1.21 x the largest output tensor above the interpreter); the parent holds no tensor data.
May assume: run as a plain process on Linux (it creates a one-rank gloo group for megatron-core's save; the
workers are forked after the imports).
"""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing as mp
import os
import pickle
import shutil
import sys
import time
from dataclasses import dataclass

import torch

from mtmegatron.models.families import ConversionError

MARKER = "conversion_complete.json"
_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


@dataclass(frozen=True)
class Chunk:
    """One DCP write item: ``key`` at ``offset`` of ``global_shape``, taken from local parameter ``local`` as the
    strided view (``storage_offset``, ``shape``, ``stride``), stored with ``prepend`` leading 1-axes."""

    key: str
    global_shape: tuple
    offset: tuple
    local: str
    storage_offset: int
    shape: tuple
    stride: tuple
    prepend: int


def _meta_model(args):
    from mtmegatron.models.gpt import build_model_chunks, transformer_config

    config = transformer_config(args)
    config.perform_initialization = False
    with torch.device("meta"):
        (model,) = build_model_chunks(args, config)
    return model


def plan_chunks(model) -> tuple[list[Chunk], dict, dict]:
    """(tensor chunks, {local name: shape}, the ShardedObjects) of the model's TP1 sharded state dict."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory

    chunks, shapes, objects = [], {}, {}
    for local, entry in model.sharded_state_dict().items():
        if isinstance(entry, ShardedObject):
            objects[local] = entry
            continue
        base = entry.data
        shapes[local] = tuple(base.shape)
        if isinstance(entry, ShardedTensorFactory):
            built = [t for t in nested_values(entry.build_fn(entry.key, base, entry.replica_id, entry.flattened_range))]
        else:
            built = [entry]
        for sh in built:
            assert isinstance(sh, ShardedTensor) and sh.flattened_range is None, (local, type(sh))
            chunks.append(Chunk(sh.key, tuple(sh.global_shape), tuple(sh.global_offset), local,
                                sh.data.storage_offset(), tuple(sh.data.shape), tuple(sh.data.stride()),
                                sh.prepend_axis_num))
    return chunks, shapes, objects


def _split(chunks: list[Chunk], shapes: dict, itemsize: dict, workers: int) -> list[list[Chunk]]:
    """Whole local tensors per worker (so each is read once), balanced by bytes, in model order per worker."""
    by_local: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_local.setdefault(c.local, []).append(c)
    load, parts = [0] * workers, [[] for _ in range(workers)]
    order = sorted(by_local, key=lambda n: -torch.Size(shapes[n]).numel() * itemsize[n])
    owner = {}
    for name in order:
        w = load.index(min(load))
        owner[name] = w
        load[w] += torch.Size(shapes[name]).numel() * itemsize[name]
    for name, group in by_local.items():
        parts[owner[name]].extend(group)
    return [p for p in parts if p]


# ---- the worker ---------------------------------------------------------------------------------------------
def _vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class BytesReporter:
    """A worker's written bytes for the parent's progress bar: at most one queue message per 64 MiB or 0.2 s.
    A message per item wakes the queue's feeder thread, which then takes the GIL from the writing thread: with a
    DeepSeek-shaped checkpoint (~4 MiB expert weights) 21% of a worker's samples sat in that wake-up."""

    def __init__(self, progress):
        self.progress, self.pending, self.last = progress, 0, time.monotonic()

    def add(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= 64 * 2**20 or time.monotonic() - self.last >= 0.2:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.progress.put(("bytes", self.pending))
            self.pending = 0
        self.last = time.monotonic()


def _reset_peak() -> None:
    """Start this process's VmHWM afresh (Linux >= 4.0), so a forked worker's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class _Sources:
    """Output chunks computed from the HF checkpoint, one output tensor at a time (the last one cached for its
    chunks). A chunk that is exactly one input's rows of a row concatenation (SwiGLU fc1's gate or up) is read
    from that input alone: the fused tensor is never built."""

    def __init__(self, hf_dir: str, args, family: str, rope_interleave: bool, dtype, shapes: dict,
                 hf_layout: dict | None = None):
        from mtmegatron.convert.hf_io import HFCheckpoint
        from mtmegatron.convert.mapping import mcore_sources

        self.hf = HFCheckpoint(hf_dir, dtype=None, keep_open=False)
        self.sources = mcore_sources(family, args, rope_interleave, hf_layout)
        self.dtype, self.shapes = dtype, shapes
        self._name, self._tensor = None, None

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.dtype is None else tensor.to(self.dtype)

    def tensor(self, local: str) -> torch.Tensor:
        if local != self._name:
            self._name, self._tensor = None, None  # drop the previous output before reading the next
            names, transform = self.sources[local]
            tensor = self._cast(transform(*(self.hf[n] for n in names)))
            rows = self.shapes[local][0]
            if any(local.endswith(v) for v in _VOCAB_ROWS) and tensor.shape[0] < rows:  # models/vocab.py padding
                tensor = torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])
            tensor = tensor.contiguous()
            if tensor.storage_offset():  # a view into a larger tensor (one expert of a stacked HF tensor):
                tensor = tensor.clone()  # chunk() cuts by absolute storage offsets, which must start at 0
            self._name, self._tensor = local, tensor
        return self._tensor

    def _whole_input(self, c: Chunk) -> str | None:
        """The HF name whose rows are exactly chunk ``c`` of a row concatenation, else None."""
        names, transform = self.sources[c.local]
        shape = self.shapes[c.local]
        if not getattr(transform, "concatenates_rows", False) or c.stride != _contiguous_stride(c.shape):
            return None
        row = torch.Size(shape[1:]).numel()
        if c.shape[1:] != tuple(shape[1:]) or c.storage_offset % row:
            return None
        start = c.storage_offset // row
        for name in names:
            rows = self.hf.stored(name)[0][0]
            if start == 0 and rows == c.shape[0]:
                return name
            start -= rows
        return None

    def chunk(self, c: Chunk) -> torch.Tensor:
        """Chunk ``c`` as a contiguous tensor of shape ``c.shape``."""
        name = self._whole_input(c)
        if name is not None:
            self._name, self._tensor = None, None  # the previous output is not needed any more
            data = self._cast(self.hf[name])
        else:
            data = self.tensor(c.local).as_strided(c.shape, c.stride, c.storage_offset)
        return data.contiguous()


def _contiguous_stride(shape: tuple) -> tuple:
    return tuple(torch.empty(shape, device="meta").stride())


def _item_by_item_writer(directory: str):
    """The DCP storage writer of a worker: torch's ``FileSystemWriter`` (its planning, metadata and ``finish``)
    with ``write_data`` replaced so that each item is resolved, written with ``torch.save`` (the format torch's
    ``FileSystemReader`` reads) and dropped before the next one is resolved. torch's own loop keeps every tensor of
    a file referenced until the file is complete, and the previous item while it resolves the next."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class ItemByItemWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            name = f"{plan.storage_data.prefix}0.distcp"
            results = []
            with open(os.path.join(str(self.path), name), "wb") as stream:
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if data.untyped_storage().nbytes() != data.nbytes:  # torch.save writes whole storages
                        data = data.clone()
                    offset = stream.tell()
                    try:
                        torch.save(data, stream)
                    except RuntimeError:  # torch's zip writer says "unexpected pos" when the disk is full
                        if os.statvfs(stream.name).f_bavail * os.statvfs(stream.name).f_frsize < data.nbytes:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), stream.name) from None
                        raise
                    del data
                    length = stream.tell() - offset
                    results.append(WriteResult(index=item.index, size_in_bytes=length,
                                               storage_data=_StorageInfo(name, offset, length)))
            done = Future()
            done.set_result(results)
            return done

    return ItemByItemWriter(directory, single_file_per_rank=True, thread_count=1, sync_files=False)


def _write_part(index: int, directory: str, chunks: list[Chunk], hf_dir: str, args, family: str,
                rope_interleave: bool, dtype, shapes: dict, itemsize: dict, progress,
                hf_layout: dict | None = None) -> None:
    """Worker process: write ``chunks`` as one DCP part into ``directory``; reports bytes, then its VmHWM, or one
    line saying why it failed."""
    exit_with_parent(os.getppid())
    try:
        _write_part_body(index, directory, chunks, hf_dir, args, family, rope_interleave, dtype, shapes, itemsize,
                         progress, hf_layout)
    except BaseException as e:
        worker_failed(index, progress, e)


def _write_part_body(index, directory, chunks, hf_dir, args, family, rope_interleave, dtype, shapes, itemsize,
                     progress, hf_layout) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner, create_default_global_save_plan
    from torch.utils.serialization import config as serialization_config
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    torch.set_num_threads(1)
    # torch.save's CRC-32 of every item was about half of a worker's time (2 GB, 2 workers: 2.5 s of worker time
    # with it, 1.1-1.3 s without); torch.load never checks it, and convert/stored_tensor.py reads without zipfile
    serialization_config.save.compute_crc32 = False  # this forked worker only
    parent = os.getppid()
    sources = _Sources(hf_dir, args, family, rope_interleave, dtype, shapes, hf_layout)
    _reset_peak()
    baseline = _vm_hwm_bytes()  # the interpreter, torch and megatron-core imported; no tensor read yet
    by_index = {(c.key, c.offset): c for c in chunks}
    written = BytesReporter(progress)

    def item(c: Chunk) -> WriteItem:
        sizes = (1,) * c.prepend + c.shape
        return WriteItem(index=MetadataIndex(c.key, torch.Size(c.offset)), type=WriteItemType.SHARD,
                         tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(c.offset), torch.Size(sizes)),
                                                     properties=TensorProperties(dtype=itemsize[c.local + ":dtype"]),
                                                     size=torch.Size(c.global_shape)))

    class LazyPlanner(DefaultSavePlanner):
        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            self.state_dict, self.is_coordinator = {}, is_coordinator

        def create_local_plan(self):
            self.plan = SavePlan([item(c) for c in chunks])
            return self.plan

        def create_global_plan(self, all_plans):
            self.global_plan, self.metadata = create_default_global_save_plan(all_plans)
            return self.global_plan, self.metadata

        def resolve_data(self, write_item):
            if os.getppid() != parent:  # the converter was killed: stop instead of writing on as an orphan
                os._exit(3)
            c = by_index[(write_item.index.fqn, tuple(write_item.index.offset))]
            data = sources.chunk(c).view((1,) * c.prepend + c.shape)
            written.add(data.numel() * data.element_size())
            return data

    dcp.save({}, storage_writer=_item_by_item_writer(directory), planner=LazyPlanner(), no_dist=True)
    written.flush()
    progress.put(("done", index, (baseline, _vm_hwm_bytes())))


# ---- the parent ---------------------------------------------------------------------------------------------
def _source_dtypes(hf, sources: dict, dtype) -> dict:
    """{local name: stored dtype}: ``dtype`` if given, else the first HF input's (FP8 weights: bfloat16)."""
    out = {}
    for local, (names, _) in sources.items():
        if dtype is not None:
            out[local] = dtype
            continue
        stored = hf.stored(names[0])[1]
        out[local] = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(stored, torch.bfloat16)
    return out


def _merge_metadata(parts: list[str], out_dir: str) -> None:
    """Move every part's DCP files into ``out_dir`` (part 0 is there already) and write one merged .metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    merged = FileSystemReader(out_dir).read_metadata()
    for i, part in enumerate(parts, start=1):
        meta = FileSystemReader(part).read_metadata()
        renames = {}
        for name in os.listdir(part):
            if name.endswith(".distcp"):
                renames[name] = f"__conv{i}_{name.lstrip('_')}"
                os.replace(os.path.join(part, name), os.path.join(out_dir, renames[name]))
        for fqn, md in meta.state_dict_metadata.items():
            if fqn in merged.state_dict_metadata:
                known = merged.state_dict_metadata[fqn]
                assert isinstance(known, TensorStorageMetadata) and known.size == md.size, fqn
                known.chunks.extend(md.chunks)
            else:
                merged.state_dict_metadata[fqn] = md
        for index, info in meta.storage_data.items():
            info.relative_path = renames[info.relative_path]
            merged.storage_data[index] = info
        shutil.rmtree(part)
    with open(os.path.join(out_dir, ".metadata"), "wb") as f:
        pickle.dump(merged, f)


def _check_sources(hf, config: dict, sources: dict, shapes: dict, unmapped=(), copies=()) -> None:
    """``copies``: HF tensors the way back writes as copies (mapping.hf_only_names), ignorable here."""
    for local in shapes:
        if local not in sources:
            raise ConversionError(f"no HF tensor maps to {local}")
    used = {n for names, _ in sources.values() for n in names}
    missing = sorted(n for n in used if n not in hf)
    if missing:
        raise ConversionError(f"{len(missing)} tensors the model needs are not in the checkpoint (first: {missing[:3]})")
    ignorable = ({"lm_head.weight"} if config.get("tie_word_embeddings") else set()) | set(unmapped) | set(copies)
    unused = [n for n in hf.names if n not in used and n not in ignorable and "rotary_emb" not in n]
    if unused:
        raise ConversionError(f"{len(unused)} checkpoint tensors have no place in the model built from config.json "
                              f"(first: {unused[:3]})")


def _check_shapes(hf, sources: dict, shapes: dict) -> None:
    """Output shapes from the HF headers alone (meta tensors through the same transforms)."""
    for local, (names, transform) in sources.items():
        metas = [torch.empty(hf.stored(n)[0], device="meta") for n in names]
        try:
            got = tuple(transform(*metas).shape)
        except RuntimeError as e:  # a reshape or concatenation the stored shapes do not allow
            stored = ", ".join(f"{n} {tuple(m.shape)}" for n, m in zip(names, metas))
            raise ConversionError(f"{local}: the checkpoint's {stored} cannot make the model built from config.json "
                                  f"(config and weights disagree: {str(e).splitlines()[0]})") from None
        want = shapes[local]
        if got != want and not (any(local.endswith(v) for v in _VOCAB_ROWS) and got[1:] == want[1:] and got[0] <= want[0]):
            raise ConversionError(f"{local}: the checkpoint gives shape {got}, the model built from config.json has "
                                  f"{want} (config and weights disagree)")


def convert(hf_dir: str, out: str, family: str, flags: list[str], rope_interleave: bool, hf_layout: dict,
            workers: int = 1, dtype: torch.dtype | None = None, quiet: bool = False, unmapped=(),
            before_marker=None) -> dict:
    """Write the converted checkpoint to ``out`` (atomically); returns stats incl. every worker's VmHWM.
    ``unmapped``: HF names the caller accounts for outside the checkpoint (LLaVA's carried tower tensors);
    ``before_marker(staging)`` writes the caller's extra files into the output before it is marked complete."""
    from megatron.core import dist_checkpointing

    from mtmegatron.convert.hf_io import HFCheckpoint
    from mtmegatron.convert.mapping import hf_only_names, mcore_sources
    from mtmegatron.convert.model import MODEL_ONLY_KEY, init_single_rank, parse_flags, saved_args
    from mtmegatron.utils.checkpoint_dirs import TRACKER, checkpoint_dir

    if os.path.exists(out):
        raise ConversionError(f"--out {out} already exists; remove it or choose another directory")
    start = time.time()
    args = parse_flags(flags)
    init_single_rank(args)
    hf = HFCheckpoint(hf_dir, dtype=None)
    config = hf.config()
    model = _meta_model(args)
    chunks, shapes, objects = plan_chunks(model)
    sources = mcore_sources(family, args, rope_interleave, hf_layout)
    _check_sources(hf, config, sources, shapes, unmapped, hf_only_names(family, args, rope_interleave, hf_layout))
    _check_shapes(hf, sources, shapes)
    dtypes = _source_dtypes(hf, sources, dtype)
    itemsize = {name: torch.empty((), dtype=dt).element_size() for name, dt in dtypes.items()}
    itemsize.update({name + ":dtype": dt for name, dt in dtypes.items()})
    total = sum(torch.Size(shapes[n]).numel() * itemsize[n] for n in shapes)

    root = os.path.abspath(out.rstrip("/"))
    with staged(root) as (staging, workers_started):
        directory = checkpoint_dir(staging, 0)
        os.makedirs(directory)
        # part 0: megatron-core itself writes the common state and the ShardedObjects, as its own save would
        _in_process_results_queue()
        dist_checkpointing.save({"model": objects, "iteration": 0, "args": saved_args(args), MODEL_ONLY_KEY: True,
                                 "model_flags": list(flags), "hf_layout": dict(hf_layout)}, directory)
        parts = _split(chunks, shapes, itemsize, max(1, workers))
        part_dirs = [os.path.join(staging, f"part{i}") for i in range(len(parts))]
        # glibc's dynamic mmap threshold would keep freed multi-MB tensors on the heap, growing a worker's RSS with
        # the checkpoint size; a fixed 1 MiB threshold returns every tensor to the system when it is freed
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))
        ctx = mp.get_context("fork")  # the imports (most of the start-up time) are inherited, not repeated
        progress = ctx.Queue()
        procs = [ctx.Process(target=_write_part, args=(i, d, p, hf_dir, args, family, rope_interleave, dtype,
                                                       shapes, itemsize, progress), kwargs={"hf_layout": hf_layout},
                             daemon=True)
                 for i, (d, p) in enumerate(zip(part_dirs, parts))]
        setup_seconds = time.time() - start  # flags, meta model, checks, layout: before any tensor is read
        workers_started.extend(procs)
        start_forked(procs)
        hwm = _follow(progress, procs, total, quiet)
        _merge_metadata(part_dirs, directory)
        with open(os.path.join(staging, TRACKER), "w") as f:
            f.write("0")
        with open(os.path.join(staging, "model_flags.txt"), "w") as f:
            import shlex

            f.write(shlex.join(flags) + "\n")
        if before_marker is not None:
            before_marker(staging)
        seconds = time.time() - start
        largest = max(torch.Size(shapes[n]).numel() * itemsize[n] for n in shapes)
        stats = {"bytes": total, "seconds": seconds, "setup_seconds": setup_seconds, "workers": len(parts),
                 "worker_vm_hwm_bytes": [h for _, h in hwm],
                 "worker_baseline_vm_hwm_bytes": [b for b, _ in hwm],
                 "parent_vm_hwm_bytes": _vm_hwm_bytes(), "largest_tensor_bytes": largest}
        with open(os.path.join(staging, MARKER), "w") as f:
            json.dump(stats, f, indent=2)
        os.replace(staging, root)
    return stats


def _in_process_results_queue() -> None:
    """megatron-core's torch_dist save hands its write results over a queue that, by default, lives in a freshly
    spawned ``multiprocessing`` Manager (a new interpreter: most of this converter's start-up, ~5-25 s measured).
    This save is synchronous and in this process, so an in-process queue carries them as well. Not a
    ``multiprocessing`` queue: its ``put`` returns before a feeder thread delivers the item, and megatron-core reads
    it with ``get_nowait`` right after, which fails under load ("results_queue should not be empty")."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "absent") is None:
        filesystem_async._results_queue = queue.Queue()


@contextlib.contextmanager
def staged(root: str):
    """``(staging directory <root>.partial.<pid>, list for the worker processes)``; the caller renames the staging
    directory to ``root`` when complete. On any failure (a bad input, a full disk, Ctrl-C) the workers are killed
    and the staging directory removed before the error goes on: nothing half-written stays behind."""
    _remove_stale_staging(root)
    staging, procs = f"{root}.partial.{os.getpid()}", []
    try:
        yield staging, procs
    except BaseException:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join()
        shutil.rmtree(staging, ignore_errors=True)
        raise


def exit_with_parent(parent: int) -> None:
    """Make this forked worker end when the converter does, however it ends (``kill -9`` included): Linux's
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` has the kernel kill it when its parent dies; a parent already gone before
    the call is caught by comparing ``os.getppid()``. Elsewhere the workers' per-item ``getppid`` checks remain."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(3)


def os_error_within(error: BaseException) -> OSError | None:
    """The OSError (a full disk, a file that cannot be read) at the root of ``error``, if that is what it is:
    followed through ``raise ... from``/during-handling chains and torch DCP's ``CheckpointException`` (which
    carries each rank's exception)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            for failure in failures.values():  # (exception, its stack summary) per rank
                found = os_error_within(failure[0] if isinstance(failure, tuple) else failure)
                if found is not None:
                    return found
        error = error.__cause__ or error.__context__
    return None


def worker_failed(index: int, progress, error: BaseException) -> None:
    """Report a worker's failure to the parent as one line (``_follow`` raises it as a ConversionError) and end the
    worker. A bad input or a full disk says what and where; anything else is a bug: its traceback is printed."""
    import traceback

    from safetensors import SafetensorError

    from mtmegatron.utils.errors import describe_os_error

    error = os_error_within(error) or error
    if isinstance(error, OSError):
        message = describe_os_error(error)
    elif isinstance(error, (ConversionError, SafetensorError)):
        message = str(error)
    else:
        traceback.print_exc()
        message = f"a conversion worker failed: {type(error).__name__}: {error}"
    progress.put(("error", index, message))
    progress.close()
    progress.join_thread()
    os._exit(1)


def _remove_stale_staging(root: str) -> None:
    """Remove ``<root>.partial.<pid>`` directories of conversions that died (their pid is gone)."""
    parent, base = os.path.dirname(root), os.path.basename(root) + ".partial."
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        pid = name[len(base):]
        if name.startswith(base) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def start_forked(procs) -> None:
    """Start the forked workers with this process's garbage collected here and the rest frozen: otherwise a
    worker's first collection may finalize the caller's leftovers (a destroyed process group, a model of an
    earlier in-process run), whose native state did not survive the fork (a segfault, seen when a converter is
    called in a process that trained and generated before)."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()


def _follow(progress, procs, total: int, quiet: bool) -> list[tuple[int, int]]:
    """Progress bar (GB/s) until every worker reported done; a worker that dies is an error. Returns each
    worker's (VmHWM before reading any tensor, VmHWM at the end)."""
    import queue

    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="converting",
               disable=quiet or not sys.stderr.isatty())
    hwm, done = {}, 0
    while done < len(procs):
        try:
            message = progress.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                bar.close()
                code = dead[0].exitcode
                raise ConversionError(f"a conversion worker ended with exit code {code}" + (
                    f" (killed by signal {-code}; out of memory?)" if code < 0 else ""))
            continue
        if message[0] == "bytes":
            bar.update(message[1])
        elif message[0] == "error":
            bar.close()
            raise ConversionError(message[2])
        else:
            hwm[message[1]] = message[2]
            done += 1
    for p in procs:
        p.join()
    bar.close()
    return [hwm[i] for i in sorted(hwm)]
