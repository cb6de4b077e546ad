"""An autouse fixture for test modules that apply and revert megatron patches by hand (import it into the module).

``mtmegatron.activate`` is a no-op while a backend counts as active, so a module that reverts patches by hand must
not leave the backend active with its patches gone: the fixture starts each test with no active backend and leaves
none, and a later test's ``activate`` installs the patches again.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_backend_around_the_test():
    import mtmegatron
    from mtmegatron import patches

    mtmegatron.deactivate()
    yield
    patches.revert_all()
    mtmegatron.deactivate()
