"""A stand-in dataset for the loader tests (``test_out_of_order.py``), in a module of its own so that a decode worker
started by the fork server imports only this (and torch), not the test module's imports."""
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
