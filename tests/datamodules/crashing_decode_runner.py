"""A stand-in for ``python -m datamodules.decode.isolated`` whose decoder crashes (a segmentation fault), for
``tests/datamodules/test_isolated_decode.py``."""
import os
import signal

if __name__ == "__main__":
    os.kill(os.getpid(), signal.SIGSEGV)
