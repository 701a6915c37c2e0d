"""Does torch.compile work in this process set-up? (a probe for the GPU machine: the fused kernels' compilation
failed there with ``FileNotFoundError: '12'`` in one run; this prints the full traceback.)

    python bench/compile_probe.py [--no-cli] [--thread] [--forkserver]

``--no-cli``: do not import ``cli`` first (its lean torchmetrics import and the compile-cache directory);
``--thread``: compile in a thread, as the early compilation does; ``--forkserver``: start the multiprocessing fork
server at the same time, as the data module's set-up does."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-cli", action="store_true")
    ap.add_argument("--thread", action="store_true")
    ap.add_argument("--forkserver", action="store_true")
    a = ap.parse_args()
    if not a.no_cli:
        import cli
        print("cache dir:", cli.use_persistent_compile_cache())
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict = {}

    def work():
        try:
            t0 = time.perf_counter()
            f = torch.compile(lambda x, w: torch.nn.functional.silu(x) * w, dynamic=False)
            x = torch.randn(64, 128, device=dev, dtype=torch.bfloat16)
            f(x, x)
            out["ok"] = time.perf_counter() - t0
        except BaseException:  # noqa: BLE001 - the probe reports whatever it is
            out["error"] = traceback.format_exc()

    if a.forkserver:
        import multiprocessing
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(["datamodules.video_items"])
    if a.thread:
        th = threading.Thread(target=work)
        th.start()
        if a.forkserver:
            forkserver.ensure_running()
        th.join()
    else:
        if a.forkserver:
            forkserver.ensure_running()
        work()
    print(f"probe {vars(a)}: TORCHINDUCTOR_CACHE_DIR={os.environ.get('TORCHINDUCTOR_CACHE_DIR')} HOME={os.environ.get('HOME')} "
          + (f"ok in {out['ok']:.1f} s" if "ok" in out else "FAILED\n" + out["error"][-4000:]), flush=True)
    return 0 if "ok" in out else 1


if __name__ == "__main__":
    sys.exit(main())
