"""The clips of ``tests/datamodules/test_nvdec.py``, written to a folder on this machine (which has ffmpeg through
``tests.media_factory``), for the GPU machine, which has none: carry the folder and run the GPU tests there with
``NVDEC_TEST_CLIPS=<folder>`` (the fixture then reads these files instead of making them).

    python bench/make_nvdec_clips.py .whl/nvdec_clips
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.datamodules.test_nvdec import write_clips  # noqa: E402


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    made = write_clips(folder)
    print(f"{len(made)} clips in {folder} ({sum(f.stat().st_size for f in folder.iterdir()) // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".whl/nvdec_clips")
