"""Shared fixtures of the omni tests."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module (the lockstep-vs-single equalities are checked at fixed reduction order)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
