"""CUDA bridge: megatron-core already speaks CUDA, so there is nothing to reconcile.

May assume: a CUDA build of torch. install()/uninstall() exist so every backend is activated the same way.
"""


def install(backend) -> None:
    pass


def uninstall() -> None:
    pass
