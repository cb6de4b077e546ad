"""Which backends the ``backend_name`` parametrization of tests/conftest.py can run here.

``backend_status()``: name -> (available, why not, device_type) for every backend mtmegatron knows.
``required_backends()``: the names ``MTMEGATRON_REQUIRE_BACKENDS=cuda,...`` asks for (scripts/gpu_conformance.sh
sets it so that GPU tests cannot silently vanish).
"""

from __future__ import annotations

import os

REQUIRE_ENV = "MTMEGATRON_REQUIRE_BACKENDS"


def backend_status() -> dict[str, tuple[bool, str | None, str]]:
    from mtmegatron.backends import BackendUnavailableError, known_backends

    status = {}
    for name, backend in known_backends().items():
        try:
            backend.require()
            status[name] = (True, None, backend.device_type)
        except BackendUnavailableError as e:
            status[name] = (False, str(e), backend.device_type)
    return status


def required_backends() -> list[str]:
    return [n for n in os.environ.get(REQUIRE_ENV, "").split(",") if n]
