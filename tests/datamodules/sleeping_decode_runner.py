"""A stand-in for ``python -m datamodules.decode.isolated`` whose decode hangs (writes its pid to
``<folder>/pid`` first), for ``tests/datamodules/test_isolated_cleanup.py``."""
import os
import sys
import time
from pathlib import Path

import datamodules.decode.isolated as isolated


def _hang(path, *args, **kwargs):
    Path(sys.argv[1], "pid").write_text(str(os.getpid()))
    time.sleep(60)


if __name__ == "__main__":
    isolated.decode_video = _hang
    isolated.main(sys.argv[1])
