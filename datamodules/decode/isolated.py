"""One video decoded in a process of its own, for a file that killed a decode worker in an earlier run of the same
output folder (a decoder crash on that file, or the out-of-memory killer while it was decoded).

A DataLoader worker that dies ends the run: the loader cannot go on without it (``datamodules.video_items``'s
:class:`~datamodules.video_items.DecodeWorkerDied` names the file). The output folder keeps the names of such files
(``decode_crashes.txt``, :class:`callbacks.jsonl_writer.JsonlPredictionWriter`), and the rerun decodes each of them with
:func:`decode_isolated`: the same :func:`~datamodules.decode.video.decode_video` call in a child process
(``python -m datamodules.decode.isolated <folder>``), its result handed back through a file. If the decoder crashes
again, only the child dies: the video gets a :class:`DecodeError` (error records for its questions) and the run goes
on.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .errors import DecodeError
from .video import DecodedVideo, decode_video

# what the rerun's records of such a video say (``video_info.decoded_isolated``) and the error of a second crash
ISOLATED_KEY = "decoded_isolated"
PROJECT = Path(__file__).resolve().parents[2]   # the folder holding the datamodules package


def decode_isolated(path: str, *args, runner: str = __name__, tmp_dir: str | None = None, **kwargs) -> DecodedVideo:
    """:func:`decode_video` ``(path, *args, **kwargs)`` in a child process: the same frames, times and info (``info``
    gets ``decoded_isolated: True``), handed back as safetensors (the frames) and JSON (no pickle). The frames come at
    the decode size: ``sizing`` (frames held at the encoder's sizes only) is not passed, which gives the same records
    (``tests/datamodules/test_hold_sizes.py``) for the one video.

    Args:
        path: the video file.
        args, kwargs: :func:`decode_video`'s other arguments, as the worker passes them (JSON values; ``sizing`` is
            dropped).
        runner: the module the child runs with ``python -m`` (this one; a test names a module that crashes).
        tmp_dir: where the hand-over folder is made (the run's ``decoding_dir``, which the main process removes even
            when this worker is killed mid-decode, e.g. by SIGTERM); ``None``: the system's temporary folder.

    Raises:
        DecodeError: the child died by a signal (the decoder crashed again: named with the signal), failed without
            an answer (its last stderr line), or :func:`decode_video` raised there (a :class:`DecodeError` with its
            own message; any other exception as the worker words an unexpected decode failure).
    """
    kwargs = {k: v for k, v in kwargs.items() if k != "sizing"}
    with tempfile.TemporaryDirectory(prefix="tokenbudget-isolated-",
                                     dir=tmp_dir if tmp_dir and Path(tmp_dir).is_dir() else None) as d:
        Path(d, "in.json").write_text(json.dumps({"path": str(path), "args": list(args), "kwargs": kwargs,
                                                              "parent": os.getpid()}),
                                      encoding="utf-8")
        # the project on the child's path first, installed or not (run from its folder, or as python /path/evaluate.py)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
        proc = subprocess.run([sys.executable, "-m", runner, d], capture_output=True, text=True, errors="replace",
                              env=env)
        if proc.returncode < 0:
            try:
                name = signal.Signals(-proc.returncode).name
            except ValueError:
                name = f"signal {-proc.returncode}"
            raise DecodeError(f"{path}: the decoder crashed on this file again ({name}), in a process of its own: it "
                              "killed a decode worker in an earlier run of this output folder")
        meta = Path(d, "out.json")
        if proc.returncode != 0 or not meta.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise DecodeError(f"{path}: the separate decode process failed (exit {proc.returncode}: {last})")
        out = json.loads(meta.read_text(encoding="utf-8"))
        if "error" in out:
            raise DecodeError(out["error"])
        frames = load_file(str(Path(d, "frames.safetensors")))["frames"]
    part = tuple(out["part"]) if out["part"] is not None else None
    return DecodedVideo(frames, out["times_s"], {**out["info"], ISOLATED_KEY: True}, part)


def _die_with_parent(parent: int | None) -> None:
    """Linux: this process is killed when the worker that started it (pid ``parent``) dies (SIGTERM at a run's stop,
    the out-of-memory killer), so no orphan goes on decoding into a folder nobody reads; it exits at once if that
    worker is already gone. Elsewhere, or where it cannot be set, a no-op."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:   # the worker died before the request was made
        os._exit(1)


def main(folder: str) -> None:
    """The child: ``<folder>/in.json`` -> :func:`decode_video` -> ``<folder>/frames.safetensors`` and
    ``<folder>/out.json`` (``times_s``, ``info``, ``part``; or ``{"error": message}`` worded as the worker words
    it)."""
    inp = json.loads(Path(folder, "in.json").read_text(encoding="utf-8"))
    _die_with_parent(inp.get("parent"))
    path = inp["path"]
    if inp["kwargs"].get("decoder", "cpu") != "cpu":   # registers READERS["nvdec"], as the worker does
        import datamodules.decode.nvdec  # noqa: F401
    try:
        video = decode_video(path, *inp["args"], **inp["kwargs"])
        frames = torch.as_tensor(video.frames).contiguous()
        save_file({"frames": frames}, str(Path(folder, "frames.safetensors")))
        result = {"times_s": list(video.times_s), "info": video.info,
                  "part": list(video.part) if video.part is not None else None}
    except DecodeError as e:
        result = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - worded as VideoQADataset words an unexpected decode failure
        first = (str(e).strip().splitlines() or [""])[0][:300]
        result = {"error": f"{path}: unexpected decode failure ({type(e).__name__}: {first})"}
    Path(folder, "out.json").write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
