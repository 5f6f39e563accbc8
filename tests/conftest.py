"""Shared pytest fixtures, and the ``cuda`` marker's skip."""

import logging

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


@pytest.fixture(autouse=True)
def root_logging_restored():
    """The root logger's handlers and level as they were before each test.

    Command-line tools run in-process (``main([...])``) call :func:`logging.basicConfig`, which hangs a
    handler on the stderr pytest captures for that test (and, in ``avsr.bin.train``, a file handler on the
    experiment's log). Left there, they write later tests' log records to a closed stream ("Logging error
    ... I/O operation on closed file") and keep the file open. Handlers a test added are closed and removed;
    pytest's own capture handlers are kept.
    """
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and type(handler).__module__ != "_pytest.logging":
            root.removeHandler(handler)
            handler.close()
    for handler in before:
        if handler not in root.handlers and type(handler).__module__ != "_pytest.logging":
            root.addHandler(handler)
    root.setLevel(level)
