"""Audio + video multiple-choice QA data (WorldSense format) for the Qwen2.5-Omni thinker: one item per video.

Each item carries all the video's questions (as :mod:`datamodules.videoqa`, whose grouping, resuming and cost-
balanced sharding are reused), the frames, and the video's own audio as 16 kHz mono float32 PCM decoded by the
``imageio-ffmpeg`` bundled ffmpeg binary in a subprocess (:func:`decode_audio`).

Frames (``frame_sampling``):

* ``omnizip`` (default): qwen_omni_utils' choice, which OmniZip's WorldSense evaluation runs (seed 003:7;
  :mod:`algorithms.omni_sampling`): decord's ``total_frames, video_fps = len(vr), vr.get_avg_fps()``
  (:func:`datamodules.decode.decord_frame_count`), ``nframes = smart_nframes(...)`` at ``fps`` with at most
  ``max_frames`` (seed 003's 1 fps / 128 by default; the package's own 2 fps / 768, which OmniZip's eval gets when
  nothing is edited, by setting them), the source frames ``linspace(0, total_frames - 1, nframes).round()``
  decoded at exactly those indices (:func:`datamodules.decode.decode_at_indices`: by decord, the release's
  reader, so legacy containers keep decord's numbering, flagged ``decord_numbering``), labelled ``index /
  video_fps``; TMRoPE's seconds per temporal patch ``temporal_patch_size / sample_fps`` with the release's
  ``sample_fps = nframes / total_frames * video_fps`` (``frame_interval_s = 1 / sample_fps``), or ``1 /
  processor_fps`` when that is set (``2.0``: what OmniZip's eval gets, see :class:`OmniQADataModule`).
* ``ffmpeg_rate``: the VideoLLaMA3 job's rule (:func:`datamodules.decode.decode_video`: seed 001's FFmpeg
  ``fps`` filter frames at ``fps``, thinned to ``max_frames`` by ``np.linspace(..., dtype=int)``), the frames
  spaced ``1 / fps`` (or duration / frames when thinned). A video without an audio stream gets silence of the video's duration and
``audio_info["has_audio"] = False``; an unreadable audio stream is an error item (one error record per question).

``python -m datamodules.omni_qa --make-demo <root>`` writes a small WorldSense-format demo from
``assets/media/*.mp4`` (plus a copy of the short clip with its audio stream removed, to exercise the silence path).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, Dataset

from algorithms.errors import SettingError, check_int

from algorithms.omni_sampling import frame_times, linspace_round_indices, qwen_omni_nframes, qwen_omni_sample_fps

from .decode import DecodeError, decode_at_indices, decode_video, decord_frame_count
from .fork_context import fork_context
from .worker_watch import worker_init
from .sharding import CostBalancedSampler, estimate_cost
from .videoqa import VideoQADataModule, VideoTask, _duration_s

log = logging.getLogger(__name__)

AUDIO_SAMPLE_RATE = 16000
FRAME_SAMPLINGS = ("omnizip", "ffmpeg_rate")
REPO = Path(__file__).resolve().parent.parent
MEDIA = REPO / "assets" / "media"
_NO_AUDIO_MARKERS = ("does not contain any stream", "matches no streams")


@dataclass
class DecodedAudio:
    """Mono PCM of a video's first audio stream.

    Attributes:
        samples: (S,) float32 in [-1, 1] at ``sample_rate``.
        has_audio: False when the file has no audio stream (``samples`` is then silence).
        truncated: the stream was cut at ``max_s``.
    """

    samples: np.ndarray
    sample_rate: int
    has_audio: bool
    truncated: bool = False

    def info(self) -> dict:
        return {"has_audio": self.has_audio, "duration_s": round(len(self.samples) / self.sample_rate, 3),
                "sample_rate": self.sample_rate, "truncated": self.truncated}


def decode_audio(path: str | Path, sample_rate: int = AUDIO_SAMPLE_RATE, silence_s: float = 0.0,
                 max_s: float | None = None) -> DecodedAudio:
    """Decode the first audio stream of ``path`` to mono float32 at ``sample_rate`` with the bundled ffmpeg.

    Args:
        path: media file.
        sample_rate: output rate (16 kHz for Qwen2.5-Omni).
        silence_s: length of the silence returned when there is no audio stream (the video's duration).
        max_s: keep at most this many seconds (``None``: all).

    Raises:
        DecodeError: missing file or ffmpeg failing for another reason than a missing audio stream.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise DecodeError(f"{path}: video file not found")
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-v", "error", "-i", str(path), "-map", "0:a:0?", "-vn",
           "-ac", "1", "-ar", str(sample_rate), "-f", "s16le"]
    if max_s is not None:
        cmd += ["-t", f"{max_s:.3f}"]
    proc = subprocess.run(cmd + ["-"], capture_output=True, check=False)
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0 or not proc.stdout:
        if any(m in err for m in _NO_AUDIO_MARKERS) or (proc.returncode == 0 and not proc.stdout):
            n = int(round(max(silence_s, 0.0) * sample_rate))
            return DecodedAudio(np.zeros(n, dtype=np.float32), sample_rate, has_audio=False)
        raise DecodeError(f"{path}: audio decoding failed (ffmpeg exit {proc.returncode}: "
                          f"{(err.strip().splitlines() or [''])[-1][:200]})")
    pcm = np.frombuffer(proc.stdout[: len(proc.stdout) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    truncated = max_s is not None and len(pcm) >= int(max_s * sample_rate) - 1
    return DecodedAudio(pcm, sample_rate, has_audio=True, truncated=bool(truncated))


class OmniQADataset(Dataset):
    """Decodes each video's frames and audio once; a failed decode yields an item with ``error`` set."""

    def __init__(self, tasks: list[VideoTask], fps: float = 1.0, max_frames: int = 128, decode_max_side: int = 896,
                 max_audio_s: float | None = None, min_audio_s: float = 1.0, frame_sampling: str = "omnizip",
                 processor_fps: float | None = None):
        if frame_sampling not in FRAME_SAMPLINGS:
            raise ValueError(f"frame_sampling must be one of {', '.join(FRAME_SAMPLINGS)}, got {frame_sampling!r}")
        if frame_sampling == "ffmpeg_rate" and (max_frames < 8 or max_frames % 8):
            raise ValueError(f"max_frames must be a positive multiple of 8 with ffmpeg_rate, got {max_frames}")
        if max_frames < 2:
            raise ValueError(f"max_frames must be at least 2, got {max_frames}")
        self.tasks, self.fps, self.max_frames = tasks, fps, max_frames
        self.decode_max_side, self.max_audio_s, self.min_audio_s = decode_max_side, max_audio_s, min_audio_s
        self.frame_sampling, self.processor_fps = frame_sampling, processor_fps

    def __len__(self) -> int:
        return len(self.tasks)

    def frames_omnizip(self, video_path: str):
        """qwen_omni_utils' frames (module docstring): ``(DecodedVideo, info additions)``.

        Raises:
            DecodeError: decord cannot open the file, ``smart_nframes`` refuses it (fewer than 2 frames: the
                release raises ``nframes should in interval [2, total_frames]``), or the decode fails.
        """
        total, video_fps = decord_frame_count(video_path)
        try:
            n = qwen_omni_nframes(total, video_fps, self.fps, max_frames=self.max_frames)
        except ValueError as e:
            raise DecodeError(f"{video_path}: qwen_omni_utils' frame count refuses the video ({total} frames at "
                              f"{video_fps:g} fps: {e})") from e
        idx = linspace_round_indices(total, n)
        dec = decode_at_indices(video_path, idx, self.decode_max_side, video_fps=video_fps)
        dec.times_s = frame_times(idx, video_fps)
        sample_fps = qwen_omni_sample_fps(n, total, video_fps)
        return dec, {"total_frames": int(total), "video_fps": round(video_fps, 6), "nframes": n,
                     "sample_fps": round(sample_fps, 6), "capped": total / video_fps * self.fps > self.max_frames,
                     "frame_interval_s": 1.0 / sample_fps}

    def frames_ffmpeg_rate(self, video_path: str):
        """Seed 001's FFmpeg-rate frames (:func:`datamodules.decode.decode_video`): ``(DecodedVideo, info
        additions)``."""
        # decode_video's cap is max_frames(B) = (B // 64) * 8 frames, so B = 8 * max_frames caps at max_frames
        dec = decode_video(video_path, 8 * self.max_frames, self.decode_max_side, base_fps=self.fps)
        t = len(dec.times_s)
        capped = dec.info["sample_fps"] < self.fps
        # nominal spacing: 1 / fps, or the duration over the frames when thinned to the cap
        return dec, {"nframes": t, "capped": capped,
                     "frame_interval_s": dec.info["duration_s"] / t if capped else 1.0 / self.fps}

    def load(self, video_path: str) -> dict:
        """``frames`` (T, H, W, 3) uint8, ``times_s``, ``video_info``, ``audio`` (S,) float32, ``audio_info``.

        ``video_info`` adds ``frame_sampling``, ``nframes``, ``sample_fps``, ``capped``, ``frame_interval_s`` (the
        spacing TMRoPE is given: the model's seconds per temporal patch is ``temporal_patch_size`` times it) and,
        with ``omnizip``, decord's ``total_frames`` / ``video_fps``; ``processor_fps`` when set."""
        if self.frame_sampling == "omnizip":
            dec, extra = self.frames_omnizip(video_path)
        else:
            dec, extra = self.frames_ffmpeg_rate(video_path)
        aud = decode_audio(video_path, silence_s=dec.info["duration_s"], max_s=self.max_audio_s)
        samples = aud.samples
        short = int(self.min_audio_s * AUDIO_SAMPLE_RATE) - len(samples)
        if short > 0:  # degenerate clips: pad with silence so the audio tower gets at least one window
            samples = np.concatenate([samples, np.zeros(short, dtype=np.float32)])
        info = {**dec.info, "frame_sampling": self.frame_sampling, **extra}
        if self.processor_fps is not None:   # the rate the processor is told (OmniZip's eval: none, so 2.0)
            info["processor_fps"] = self.processor_fps
            info["frame_interval_s"] = 1.0 / self.processor_fps
        return {"frames": dec.frames, "times_s": dec.times_s, "video_info": info, "audio": samples,
                "audio_info": {**aud.info(), "padded_s": round(max(short, 0) / AUDIO_SAMPLE_RATE, 3)}}

    def __getitem__(self, i: int) -> dict:
        task = self.tasks[i]
        item = {"video_id": task.video_id, "video_path": task.video_path, "benchmark": task.benchmark,
                "questions": [asdict(q) for q in task.questions], "jobs": task.jobs, "error": None}
        try:
            item.update(self.load(task.video_path))
        except DecodeError as e:
            item["error"] = str(e)
        except Exception as e:  # noqa: BLE001 - any decoder failure must become an error record, not a crash
            item["error"] = f"{task.video_path}: unexpected decode failure ({type(e).__name__}: {e})"
        return item


class OmniQADataModule(VideoQADataModule):
    """WorldSense-format questions grouped by video, with frames and audio for the omni model.

    Args:
        benchmark: loader name (``worldsense``).
        root: benchmark root (``worldsense_qa.json`` + ``videos/``).
        loader_kwargs: extra loader arguments.
        frame_sampling: ``omnizip`` (default: qwen_omni_utils' ``smart_nframes`` + ``linspace(...).round()``, as
            OmniZip's WorldSense evaluation samples, seed 003:7) or ``ffmpeg_rate`` (seed 001's FFmpeg ``fps``
            filter frames, the VideoLLaMA3 job's rule); see the module docstring.
        fps: frame sampling rate. Default 1, seed 003's ("1 fps"); ``2.0`` is qwen_omni_utils' ``FPS``, what
            OmniZip's eval gets from the unedited package.
        max_frames: frame cap. Default 128, seed 003's ("最大帧数为 128 帧"); ``768`` is the package's
            ``FPS_MAX_FRAMES``. ``omnizip``: at least 2 (the release floors it to even); ``ffmpeg_rate``: a multiple
            of 8, frames evenly spread over longer videos.
        processor_fps: the rate the processor is told, which sets TMRoPE's seconds per temporal patch
            (``temporal_patch_size / processor_fps``). Default ``2.0``, as OmniZip's eval (KD-TAO/OmniZip@9060291:
            eval/eval.py:evaluate_sample) runs: it passes the processor no ``fps``, so transformers'
            ``Qwen2_5OmniProcessor`` takes its hard-coded 2.0 whatever the sampling. ``None``: the sampling's own
            rate (``omnizip``: qwen_omni_utils' ``sample_fps``, what ``process_mm_info(..., return_video_kwargs=True)``
            gives the processor), a departure from the eval (docs/deviations.md).
        max_audio_s: keep at most this much audio (``None``: the whole track).
        num_workers, prefetch_factor, decode_max_side, limit_videos: as :class:`VideoQADataModule`.
    """

    # absent from a run.json written before these settings existed: that folder's frames were ffmpeg_rate's
    RECORD_DEFAULTS = {**VideoQADataModule.RECORD_DEFAULTS, "frame_sampling": "ffmpeg_rate", "processor_fps": None}

    def __init__(self, benchmark: str = "worldsense", root: str = "outputs/demo_worldsense",
                 loader_kwargs: dict | None = None, frame_sampling: str = "omnizip", fps: float = 1.0,
                 max_frames: int = 128, processor_fps: float | None = 2.0, max_audio_s: float | None = None,
                 num_workers: int | None = 2, prefetch_factor: int = 2, decode_max_side: int = 896,
                 limit_videos: int | None = None):
        super().__init__(benchmark=benchmark, root=root, loader_kwargs=loader_kwargs, num_workers=num_workers,
                         prefetch_factor=prefetch_factor, decode_max_side=decode_max_side, limit_videos=limit_videos)
        if frame_sampling not in FRAME_SAMPLINGS:
            raise SettingError(f"data.frame_sampling={frame_sampling!r}: expected one of {', '.join(FRAME_SAMPLINGS)}")
        if frame_sampling == "ffmpeg_rate":
            check_int("data.max_frames", max_frames, 8)
            if max_frames % 8:
                raise SettingError(f"data.max_frames={max_frames}: expected a multiple of 8 with "
                                   f"data.frame_sampling=ffmpeg_rate")
        else:
            check_int("data.max_frames", max_frames, 2)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 30:
            raise SettingError(f"data.fps={fps!r}: expected frames per second in (0, 30]")
        if processor_fps is not None and (isinstance(processor_fps, bool) or not isinstance(processor_fps, (int, float))
                                          or not processor_fps > 0):
            raise SettingError(f"data.processor_fps={processor_fps!r}: expected frames per second > 0, or null for "
                               f"the sampling's own rate")
        if max_audio_s is not None and not max_audio_s > 0:
            raise SettingError(f"data.max_audio_s={max_audio_s!r}: expected seconds > 0, or null for the whole track")
        self.frame_sampling, self.fps, self.max_frames, self.max_audio_s = frame_sampling, fps, max_frames, max_audio_s
        self.processor_fps = None if processor_fps is None else float(processor_fps)

    def record_settings(self) -> dict:
        """:meth:`VideoQADataModule.record_settings` plus the frame sampling, rate, cap, processor rate and audio
        length."""
        return {**super().record_settings(), "frame_sampling": self.frame_sampling, "fps": self.fps,
                "max_frames": self.max_frames, "processor_fps": self.processor_fps, "max_audio_s": self.max_audio_s}

    def dataset(self, tasks: list[VideoTask]) -> OmniQADataset:
        return OmniQADataset(tasks, self.fps, self.max_frames, self.decode_max_side, self.max_audio_s,
                             frame_sampling=self.frame_sampling, processor_fps=self.processor_fps)

    def predict_dataloader(self) -> DataLoader:
        """This rank's videos, done (job, qid) pairs removed first (see :class:`VideoQADataModule`); a resumed run
        prints how many of its (job, question) records are already written (:meth:`VideoQADataModule.report_resume`)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is None or not hasattr(module, "jobs"):
            raise RuntimeError("OmniQADataModule needs a LightningModule exposing `jobs`")
        jobs = list(module.jobs)
        done = self.written_qids()   # (refused where the annotation changed since: VideoQADataModule)
        tasks = self.tasks(jobs, done)
        costs = [estimate_cost(_duration_s(t), t.video_path, sum(len(js) for js in t.jobs.values()), 1)
                 for t in tasks]
        world, rank = self.trainer.world_size, self.trainer.global_rank
        if world > 1 and self.trainer._accelerator_connector.use_distributed_sampler:
            raise RuntimeError("OmniQADataModule shards whole videos itself: set `trainer.use_distributed_sampler: "
                               "false`")
        workers = self.workers
        sampler = CostBalancedSampler(costs, world, rank, workers)
        self.report_resume(jobs, done, tasks, len(sampler))   # "N of M (job, question) records already written"
        return DataLoader(self.dataset(tasks), batch_size=None, sampler=sampler, num_workers=workers,
                          prefetch_factor=self.prefetch_factor if workers > 0 else None,
                          persistent_workers=False,
                          multiprocessing_context=fork_context() if workers > 0 else None,
                          worker_init_fn=worker_init(workers))


# --------------------------------------------------------------------------------------------------- demo
DEMO_QUESTIONS = {
    "cockatoo": {
        # its mp3 track is digital silence
        "domain": "Animals", "sub_category": "Birds", "duration": 14.0, "audio_class": ["Silence"],
        "task0": {"question": "What animal is shown in the video?",
                  "candidates": ["A. A dog", "B. A cockatoo", "C. A cat", "D. A horse"], "answer": "B",
                  "task_domain": "Recognition", "task_type": "Object Recognition"},
        "task1": {"question": "Where is the bird standing for most of the video?",
                  "candidates": ["A. On the ground", "B. In water", "C. On a perch", "D. On a person's head"],
                  "answer": "C", "task_domain": "Spatial", "task_type": "Spatial Relation"},
    },
    "realshort": {
        "domain": "Daily Life", "sub_category": "Misc", "duration": 1.2, "audio_class": ["Sound"],
        "task0": {"question": "About how long is this clip?",
                  "candidates": ["A. About one second", "B. About one minute", "C. About ten minutes",
                                 "D. About one hour"], "answer": "A",
                  "task_domain": "Temporal", "task_type": "Temporal Counting"},
    },
    "realshort_silent": {
        "domain": "Daily Life", "sub_category": "Misc", "duration": 1.2, "audio_class": [],
        "task0": {"question": "Is there any sound in this clip?",
                  "candidates": ["A. Loud music", "B. Speech", "C. Birdsong", "D. No sound at all"], "answer": "D",
                  "task_domain": "Audio", "task_type": "Audio Recognition"},
    },
}


def make_demo(root: str | Path, media_dir: str | Path = MEDIA) -> Path:
    """Write a WorldSense-format demo to ``root``: ``worldsense_qa.json`` (the public release shape) and
    ``videos/{cockatoo, realshort, realshort_silent}.mp4`` (the last one with its audio stream removed by a stream
    copy of the video). Returns ``root``."""
    import imageio_ffmpeg

    root, media_dir = Path(root), Path(media_dir)
    videos = root / "videos"
    videos.mkdir(parents=True, exist_ok=True)
    for name in ("cockatoo", "realshort"):
        shutil.copyfile(media_dir / f"{name}.mp4", videos / f"{name}.mp4")
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-i",
                    str(media_dir / "realshort.mp4"), "-an", "-c:v", "copy", str(videos / "realshort_silent.mp4")],
                   check=True, capture_output=True)
    data = {vid: {"video_id": vid, **fields} for vid, fields in DEMO_QUESTIONS.items()}
    (root / "worldsense_qa.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="WorldSense-format demo data for the omni QA job")
    ap.add_argument("--make-demo", metavar="ROOT", required=True, help="write the demo benchmark root here")
    args = ap.parse_args(argv)
    print(make_demo(args.make_demo))


if __name__ == "__main__":
    main()
