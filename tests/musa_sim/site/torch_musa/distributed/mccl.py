"""The "mccl" torch.distributed backend of the simulated MUSA device.

A Python ``ProcessGroup`` over a private gloo group (same store, prefixed) that runs every collective on
zero-copy host aliases of the musa tensors, so results land in device memory (uneven all_gather outputs and reduce_scatter
inputs are accepted, as NCCL accepts them). Like NCCL/MCCL it refuses host
tensors (RuntimeError naming the op and the tensor's device) and non-contiguous tensors. Every call and refusal
is counted in torch_musa.sim. Collectives complete before they return (the Work is already done); send/recv
return gloo's pending work so both directions of a batch_isend_irecv can be posted before anything waits.

May assume: torch.distributed with gloo; tensors of one call share a dtype (as NCCL requires).
"""

from __future__ import annotations

import atexit
import collections
import datetime
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import sim
from .._ext import ext

NAME = "mccl"

# gloo's worker thread drops its references to a finished op's tensors a moment after wait() returns. If Python
# has already dropped the host aliases, that thread must take the GIL to free them, which aborts the process
# when it happens during interpreter shutdown. So the aliases of recent ops stay referenced here, and are
# released at exit once gloo has had time to let go of them. Only the last few ops matter (older ones were let go
# long ago), and each alias keeps its device storage allocated: 512 held ~28 MiB per iteration of torch FSDP2's
# gathered weights counted as live device bytes (benchmarks/memory.py's peaks); 16 keep what a shutdown needs.
_recent_hosts: collections.deque = collections.deque(maxlen=16)


@atexit.register
def _release_recent_hosts() -> None:
    if _recent_hosts:
        time.sleep(0.05)
        _recent_hosts.clear()


class _Work(dist.Work):
    def __init__(self, result=None, pending=None):
        super().__init__()
        self._result = result
        self._pending = pending

    def wait(self, timeout=None):
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        return True

    def is_completed(self):
        return self._pending is None or self._pending.is_completed()

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        self.wait()
        return self._result or []

    def synchronize(self):
        self.wait()

    def get_future(self):
        self.wait()
        future = torch.futures.Future()
        future.set_result(self._result or [])
        return future


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class MCCLProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("musa_sim_mccl/", store), rank, size, timeout)
        # torch_musa's ProcessGroupMCCL is a c10d Backend that torch wraps in a named ProcessGroup; a Python
        # ProcessGroup has a name only through a registered backend (DeviceMesh.from_group reads it). The
        # collectives still run through the methods below; a C++-side call would reach gloo and refuse the
        # musa tensor, loudly.
        self._register_backend(torch.device("musa"), dist.ProcessGroup.BackendType.CUSTOM, self._gloo)

    # ---- helpers -------------------------------------------------------------------------------------
    def _host(self, op: str, tensors):
        hosts = []
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type != "musa":
                sim.refuse(op)
                where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
                raise RuntimeError(
                    f"mccl {op}: Tensors must be MUSA and dense, got a tensor on {where} "
                    "(MCCL, like NCCL, reads device memory only: move it to the musa device first)"
                )
            if not t.is_contiguous():
                sim.refuse(op)
                raise RuntimeError(f"mccl {op}: Tensors must be contiguous")
            hosts.append(ext.host_alias(t))
        _recent_hosts.append(hosts)
        return hosts

    def _reduce_op(self, op, tensors_for_avg):
        """gloo has no AVG: sum, then divide after the call."""
        op = getattr(op, "op", op)  # ReduceOp -> RedOpType
        if op == dist.ReduceOp.AVG:
            return dist.ReduceOp.SUM, tensors_for_avg
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            return op, []
        raise RuntimeError(f"mccl (simulated): reduce op {op} is not supported")

    def _allreduce_host(self, hosts, op):
        red, to_average = self._reduce_op(op, hosts)
        opts = c10d.AllreduceOptions()
        opts.reduceOp = red
        self._gloo.allreduce(hosts, opts).wait()
        for h in to_average:
            h.div_(self.size()) if h.is_floating_point() else h.floor_divide_(self.size())

    # ---- identity ------------------------------------------------------------------------------------
    def getBackendName(self):
        return NAME

    def name(self):
        return NAME

    @property
    def _device_types(self):
        return [torch.device("musa")]

    def _start_coalescing(self, device):
        pass

    def _end_coalescing(self, device):
        return _Work()

    # ---- collectives ---------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        hosts = self._host("all_reduce", tensors)
        sim.count("all_reduce", _nbytes(tensors))
        self._allreduce_host(hosts, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return _Work(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        hosts = self._host("all_reduce_coalesced", tensors)
        sim.count("all_reduce_coalesced", _nbytes(tensors))
        self._allreduce_host(hosts, opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        return _Work(tensors)

    def broadcast(self, tensors, opts):
        hosts = self._host("broadcast", tensors)
        sim.count("broadcast", _nbytes(tensors))
        self._gloo.broadcast(hosts, opts).wait()
        return _Work(tensors)

    def reduce(self, tensors, opts):
        hosts = self._host("reduce", tensors)
        sim.count("reduce", _nbytes(tensors))
        red, to_average = self._reduce_op(opts.reduceOp, hosts)
        gopts = c10d.ReduceOptions()
        gopts.reduceOp, gopts.rootRank, gopts.rootTensor = red, opts.rootRank, opts.rootTensor
        self._gloo.reduce(hosts, gopts).wait()
        if self.rank() == opts.rootRank:
            for h in to_average:
                h.div_(self.size())
        return _Work(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        hosts_in = self._host("all_gather", inputs)
        hosts_out = [self._host("all_gather", outs) for outs in output_lists]
        sim.count("all_gather", _nbytes(inputs))
        if all(o.numel() == i.numel() for outs, i in zip(hosts_out, hosts_in) for o in outs):
            self._gloo.allgather(hosts_out, hosts_in, c10d.AllgatherOptions()).wait()
        else:  # NCCL (and so MCCL) gathers uneven sizes, gloo refuses them: gather padded copies, then cut
            for outs, host_in in zip(hosts_out, hosts_in):
                width = max(o.numel() for o in outs)
                padded = host_in.new_zeros(width)
                padded[: host_in.numel()].copy_(host_in.reshape(-1))
                buffers = [host_in.new_empty(width) for _ in outs]
                _recent_hosts.append([padded, *buffers])
                self._gloo.allgather([buffers], [padded], c10d.AllgatherOptions()).wait()
                for out, buffer in zip(outs, buffers):
                    out.copy_(buffer[: out.numel()].view_as(out))
        return _Work(output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            self.allgather([outs], [inp])
        return _Work(output_lists)

    def _gather_into(self, op, output, input):
        (h_in,) = self._host(op, [input])
        (h_out,) = self._host(op, [output])
        sim.count(op, _nbytes([input]))
        chunks = list(h_out.view(self.size(), -1).unbind(0))
        _recent_hosts.append(chunks)
        self._gloo.allgather([chunks], [h_in.view(-1)], c10d.AllgatherOptions()).wait()

    def _allgather_base(self, output, input, opts=None):
        self._gather_into("all_gather_into_tensor", output, input)
        return _Work([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._gather_into("all_gather_into_tensor_coalesced", output, input)
        return _Work(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _scatter_reduce(self, op, output, input_flat_host, reduce_op):
        (h_out,) = self._host(op, [output])
        work = input_flat_host.clone()
        _recent_hosts.append([work])
        self._allreduce_host([work], reduce_op)
        h_out.view(-1).copy_(work.view(self.size(), -1)[self.rank()])

    def _reduce_scatter_base(self, output, input, opts=None):
        (h_in,) = self._host("reduce_scatter_tensor", [input])
        sim.count("reduce_scatter_tensor", _nbytes([input]))
        self._scatter_reduce("reduce_scatter_tensor", output, h_in, opts.reduceOp)
        return _Work([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            (h_in,) = self._host("reduce_scatter_tensor_coalesced", [input])
            sim.count("reduce_scatter_tensor_coalesced", _nbytes([input]))
            self._scatter_reduce("reduce_scatter_tensor_coalesced", output, h_in, opts.reduceOp)
        return _Work(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for output, inputs in zip(outputs, input_lists):
            hosts = self._host("reduce_scatter", inputs)
            sim.count("reduce_scatter", _nbytes(inputs))
            if len({h.numel() for h in hosts}) == 1:
                flat = torch.cat([h.reshape(-1) for h in hosts])
                self._scatter_reduce("reduce_scatter", output, flat, opts.reduceOp)
                continue
            # NCCL reduces uneven pieces one destination at a time; so does this (gloo has no uneven form)
            (h_out,) = self._host("reduce_scatter", [output])
            for rank, piece in enumerate(hosts):
                work = piece.clone()
                _recent_hosts.append([work])
                self._allreduce_host([work], opts.reduceOp)
                if rank == self.rank():
                    h_out.copy_(work.view_as(h_out))
        return _Work(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        (h_in,) = self._host("all_to_all_single", [input])
        (h_out,) = self._host("all_to_all_single", [output])
        sim.count("all_to_all_single", _nbytes([input]))
        self._gloo.alltoall_base(h_out, h_in, list(output_split_sizes), list(input_split_sizes),
                                 c10d.AllToAllOptions()).wait()
        return _Work([output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        h_in = self._host("all_to_all", inputs)
        h_out = self._host("all_to_all", outputs)
        sim.count("all_to_all", _nbytes(inputs))
        flat_in = torch.cat([h.reshape(-1) for h in h_in])
        flat_out = torch.empty(sum(h.numel() for h in h_out), dtype=flat_in.dtype)
        _recent_hosts.append([flat_in, flat_out])
        self._gloo.alltoall_base(flat_out, flat_in, [h.numel() for h in h_out], [h.numel() for h in h_in],
                                 c10d.AllToAllOptions()).wait()
        for h, part in zip(h_out, flat_out.split([h.numel() for h in h_out])):
            h.view(-1).copy_(part)
        return _Work(outputs)

    def gather(self, output_lists, inputs, opts):
        h_in = self._host("gather", inputs)
        h_out = [self._host("gather", outs) for outs in output_lists]
        sim.count("gather", _nbytes(inputs))
        self._gloo.gather(h_out, h_in, opts).wait()
        return _Work(output_lists)

    def scatter(self, outputs, input_lists, opts):
        h_out = self._host("scatter", outputs)
        h_in = [self._host("scatter", ins) for ins in input_lists]
        sim.count("scatter", sum(_nbytes(ins) for ins in input_lists))
        self._gloo.scatter(h_out, h_in, opts).wait()
        return _Work(outputs)

    def barrier(self, opts=None):
        sim.count("barrier", 0)
        self._gloo.barrier(c10d.BarrierOptions()).wait()
        return _Work()

    # ---- point to point ------------------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        hosts = self._host("send", tensors)
        sim.count("send", _nbytes(tensors))
        return _Work(tensors, pending=self._gloo.send(hosts, dst, tag))

    def recv(self, tensors, src, tag=0):
        hosts = self._host("recv", tensors)
        sim.count("recv", _nbytes(tensors))
        return _Work(tensors, pending=self._gloo.recv(hosts, src, tag))

    def recv_anysource(self, tensors, tag=0):
        hosts = self._host("recv", tensors)
        sim.count("recv", _nbytes(tensors))
        return _Work(tensors, pending=self._gloo.recv_anysource(hosts, tag))


def _create(store, rank, size, timeout):
    return MCCLProcessGroup(store, rank, size, timeout)


def register() -> None:
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["musa"])
