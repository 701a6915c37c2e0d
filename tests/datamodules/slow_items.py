"""A stand-in dataset for the loader tests (``test_out_of_order.py``), in a module of its own so that a decode worker
started by the fork server imports only this (and torch), not the test module's imports; and what a worker reports
about its own process (``test_worker_start.py``)."""
import json
import sys
import time

from torch.utils.data import Dataset


class SlowItems(Dataset):
    """Item ``i`` takes ``delay[i]`` seconds to "decode" and is ``i``."""

    def __init__(self, delay):
        self.delay = list(delay)

    def __len__(self):
        return len(self.delay)

    def __getitem__(self, i):
        time.sleep(self.delay[i])
        return i


def report_worker_state(path: str, worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` (bound to ``path`` with ``functools.partial``): write this worker's imported
    modules and CUDA state to ``<path>.<worker_id>.json``. ``cuda_from_parent``: torch's after-fork flag, set in a
    child forked from a process that had initialized CUDA (such a child's own ``is_initialized()`` reads False)."""
    import torch

    with open(f"{path}.{worker_id}.json", "w") as f:
        json.dump({"modules": sorted(sys.modules), "cuda_initialized": torch.cuda.is_initialized(),
                   "cuda_from_parent": torch.cuda._is_in_bad_fork()}, f)


class Niceness(Dataset):
    """Item ``i`` is the niceness of the process that makes it (``os.nice(0)``: the current value)."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        import os

        return os.nice(0)
