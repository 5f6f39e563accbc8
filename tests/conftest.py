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
