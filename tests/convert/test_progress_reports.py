"""Workers report written bytes in batches (convert/streaming.py ``BytesReporter``): every byte reaches the
progress bar, in far fewer queue messages than items."""

from __future__ import annotations

from mtmegatron.convert import streaming


class _Queue(list):
    def put(self, message):
        self.append(message)


def test_every_byte_arrives_in_few_messages(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(streaming.time, "monotonic", lambda: clock[0])
    queue = _Queue()
    reporter = streaming.BytesReporter(queue)
    sizes = [3 * 2**20 + i for i in range(200)]  # 200 items of ~3 MiB in no time: a message per 64 MiB
    for size in sizes:
        reporter.add(size)
    assert 9 <= len(queue) <= 10, len(queue)
    clock[0] = 0.5  # a slow item: reported once 0.2 s have passed, however small
    reporter.add(7)
    assert queue[-1] == ("bytes", queue[-1][1]) and reporter.pending == 0
    reporter.add(5)
    reporter.flush()
    reporter.flush()  # nothing pending: no empty message
    assert all(kind == "bytes" and n > 0 for kind, n in queue)
    assert sum(n for _, n in queue) == sum(sizes) + 7 + 5
