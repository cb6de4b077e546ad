"""Per-rank body of test_simulator's 2-rank mccl test (run by torchrun on the simulated MUSA device).

Checks the values of every collective in place and exits non-zero on any mismatch; the test then reads the
per-process stats file (MUSA_SIM_STATS_DIR) to check the counts and the host-tensor refusal.
"""

import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.musa.set_device(rank)
dist.init_process_group("mccl")
assert dist.get_backend() == "mccl", dist.get_backend()
dev = torch.device("musa", rank)

x = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(x)
assert x.device == dev and x.tolist() == [3.0] * 4, x
avg = torch.full((2,), float(rank + 1), device=dev)
dist.all_reduce(avg, op=dist.ReduceOp.AVG)
assert avg.tolist() == [1.5, 1.5], avg

gathered = torch.empty(4, device=dev)
dist.all_gather_into_tensor(gathered, torch.tensor([rank, rank + 10.0], device=dev))
assert gathered.tolist() == [0.0, 10.0, 1.0, 11.0], gathered

scattered = torch.empty(2, device=dev)
dist.reduce_scatter_tensor(scattered, torch.arange(4.0, device=dev) + rank)
assert scattered.tolist() == ([1.0, 3.0] if rank == 0 else [5.0, 7.0]), scattered

uneven = [torch.empty(1, device=dev), torch.empty(2, device=dev)]  # NCCL accepts uneven all_gather outputs
dist.all_gather(uneven, torch.arange(rank + 1.0, device=dev) + 5)
assert [t.tolist() for t in uneven] == [[5.0], [5.0, 6.0]], uneven

mine_uneven = torch.empty(rank + 1, device=dev)  # uneven reduce_scatter: rank r keeps r + 1 values
dist.reduce_scatter(mine_uneven, [torch.full((1,), 1.0 + rank, device=dev), torch.full((2,), 10.0 * (rank + 1), device=dev)])
assert mine_uneven.tolist() == ([3.0] if rank == 0 else [30.0, 30.0]), mine_uneven

splits = [1, 2] if rank == 0 else [2, 1]  # uneven: rank0 keeps 1 sends 2, rank1 sends 2 keeps 1
a2a = torch.empty(3, device=dev)
dist.all_to_all_single(a2a, torch.arange(3.0, device=dev) + 10 * rank, splits, splits)
assert a2a.tolist() == ([0.0, 10.0, 11.0] if rank == 0 else [1.0, 2.0, 12.0]), a2a

mine, theirs = torch.full((3,), float(rank), device=dev), torch.empty(3, device=dev)
ops = [dist.P2POp(dist.isend, mine, 1 - rank, tag=7), dist.P2POp(dist.irecv, theirs, 1 - rank, tag=7)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
assert theirs.tolist() == [float(1 - rank)] * 3, theirs

if rank == 0:
    dist.send(torch.tensor([5.0, 6.0], device=dev), 1)
else:
    got = torch.zeros(2, device=dev)
    dist.recv(got, 0)
    assert got.tolist() == [5.0, 6.0], got

objects = [None, None]
dist.all_gather_object(objects, {"rank": rank})
assert objects == [{"rank": 0}, {"rank": 1}], objects
work = dist.all_reduce(torch.ones(1, device=dev), async_op=True)
work.wait()
dist.barrier()

try:
    dist.all_reduce(torch.ones(2))  # a host tensor: NCCL/MCCL refuse it
except RuntimeError as e:
    assert "all_reduce" in str(e) and "cpu" in str(e), e
else:
    raise AssertionError("mccl accepted a host tensor")
dist.destroy_process_group()
print(f"rank {rank} ok")
