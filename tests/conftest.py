"""Shared pytest fixtures, and the ``cuda`` marker's skip."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip, with the reason, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def exact_cuda_float32():
    """CUDA float32 without TF32 (cuBLAS matmuls and cuDNN convolutions round inputs to 10 mantissa bits with
    it): CPU/CUDA parity tests compare float32 with float32."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


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
