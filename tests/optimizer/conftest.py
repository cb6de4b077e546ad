"""The session fixture of the optimizer tests: ``offload_runs`` (tests/helpers/offload_runs.py), each distinct
pretrain command run once per pytest session."""

from __future__ import annotations

import pytest

from helpers.offload_runs import OffloadRuns


@pytest.fixture(scope="session")
def offload_runs(tmp_path_factory):
    return OffloadRuns(tmp_path_factory.mktemp("optimizer_runs"))
