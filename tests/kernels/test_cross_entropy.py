"""Fused cross-entropy: opcheck, native vs F.cross_entropy (ignore_index, bf16 logits), float64 gradcheck,
the vocab-sharded statistics recombined as the TP wrapper does, and a real 2-rank gloo run of
vocab_parallel_cross_entropy against the full-vocab loss."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from mtmegatron.ops import cross_entropy as ce
from mtmegatron.ops.vocab_parallel import vocab_parallel_cross_entropy

from helpers.ports import free_port
from kutil import randn


def test_opcheck(gen):
    logits = randn(gen, 5, 33, requires_grad=True)
    target = torch.randint(0, 33, (5,), generator=gen)
    torch.library.opcheck(ce.cross_entropy_op, (logits, target, -100))
    torch.library.opcheck(ce.cross_entropy_stats_op, (logits.detach(), target, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab", [(1, 17), (13, 1001)])
def test_matches_torch(gen, dtype, rows, vocab):
    logits = (randn(gen, rows, vocab) * 4).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=gen)
    if rows > 1:
        target[1] = -100
    loss = ce.cross_entropy(logits, target)
    l2 = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(l2, target, reduction="none", ignore_index=-100)
    g = torch.rand(rows, generator=gen)
    loss.backward(g)
    ref.backward(g)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(logits.grad.float(), l2.grad, **tol)


def test_gradcheck_float64(gen):
    logits = randn(gen, 4, 9, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 8, -100, 3])
    assert torch.autograd.gradcheck(lambda x: ce.cross_entropy(x, target), (logits,))


def test_sharded_stats_recombine(gen):
    logits = randn(gen, 6, 40) * 3
    target = torch.randint(0, 40, (6,), generator=gen)
    shards = [ce.cross_entropy_stats_op(part.contiguous(), target, 10 * i) for i, part in enumerate(logits.split(10, -1))]
    mx = torch.stack([s[0] for s in shards]).amax(0)
    se = sum(s[1] * torch.exp(s[0] - mx) for s in shards)
    tl = sum(s[2] for s in shards)
    torch.testing.assert_close(mx + se.log() - tl, F.cross_entropy(logits, target, reduction="none"))


def _tp_worker(rank, world, port, logits, target, grad, expected_loss, expected_grad):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        shard = logits.chunk(world, -1)[rank].contiguous().requires_grad_()
        loss = vocab_parallel_cross_entropy(shard, target, tp_group=dist.group.WORLD)
        loss.backward(grad)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(shard.grad, expected_grad.chunk(world, -1)[rank], rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_two_ranks(gen):
    s, b, v = 3, 2, 64
    logits = randn(gen, s, b, v) * 3
    target = torch.randint(0, v, (s, b), generator=gen)
    grad = torch.rand(s, b, generator=gen)
    ref_logits = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_logits.view(-1, v), target.view(-1), reduction="none").view(s, b)
    ref.backward(grad)
    mp.spawn(_tp_worker, args=(2, free_port(), logits, target, grad, ref.detach(), ref_logits.grad), nprocs=2)
