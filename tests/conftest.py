"""Shared pytest fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Small tensors: one intra-op thread is faster (and steadier on a shared 2-core machine).

    Modules that want it for every test set ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def ieee_subnormals():
    """Every test starts and ends with IEEE subnormals: a Trainer (``flush_denormal: true``) switches the
    calling thread to flush-to-zero, which must not leak into the parity tests that run after it."""
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)
