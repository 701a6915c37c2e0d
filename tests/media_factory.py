"""Odd and broken media for the hardening tests (issue 8), made with ffmpeg into a temporary folder.

The ffmpeg binary is imageio-ffmpeg's bundled one (else ``ffmpeg`` on ``PATH``). Every file is tiny (64x48 px, a
few seconds at a few fps) except the 4K case (3840x2160, 2 s at 5 fps). :class:`MediaFactory` makes each kind on
first request and caches it; the ``media`` fixture in the test modules shares one factory per test session, so
each file is encoded once however many tests use it.

Kinds (``MediaFactory.get(kind)`` returns the path):

===================  ==================================================================================
``good``             4 s, 8 fps, 64x48, H.264 yuv420p, mp4 (moov at the front)
``missing``          a path that does not exist
``zero_bytes``       an empty ``.mp4``
``truncated``        ``good_moov_end`` cut to 60% (moov atom, written at the end, is lost)
``truncated_tail``   ``good`` (moov at the front) cut to 55%: the index lists frames whose bytes are gone
``corrupt_middle``   ``good`` with 2 kB of random bytes written over the middle of the file
``garbage``          4 kB of random bytes named ``.mp4``
``pts_equal``        ``intra_mkv`` (3 s, 8 fps, MJPEG in mkv) with every pts 0 (``setts`` bitstream filter)
``pts_backwards``    ``intra_mkv`` with pts running backwards (frame n at (23 - n) / 8 s)
``audio_only``       an AAC mp4 with no video stream
``single_frame``     one frame
``sub_step``         0.4 s (4 frames at 10 fps), shorter than one 1 fps sampling step
``long_tiny``        30 minutes at 1 fps, 32x24 (1800 frames, about 100 kB)
``vfr``              variable frame rate: 2 s at 10 fps then 4 s at 1 fps (container average fps misleads)
``rotated``          ``pattern`` with a 90-degree display rotation in the mp4 track header
``pattern``          64x48, quadrants of distinct colours (to see a rotation), 2 s at 4 fps
``odd_dims``         63x47 px (mjpeg in avi; H.264 4:2:0 cannot be odd)
``yuv444``           H.264 High 4:4:4
``yuv420p10``        H.264 10-bit
``mkv`` / ``webm`` / ``avi``   H.264 in Matroska, VP9 in WebM, MPEG-4 part 2 in AVI
``unicode_path``     ``good`` copied to ``"vidéo 日本 ملف/clip with spaces é.mp4"``
``uhd``              3840x2160, 2 s at 5 fps
===================  ==================================================================================
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

W, H = 64, 48


def ffmpeg_exe() -> str:
    """The ffmpeg binary (imageio-ffmpeg's, else the system one)."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # noqa: BLE001
        exe = shutil.which("ffmpeg")
        if not exe:
            raise RuntimeError("no ffmpeg: install imageio-ffmpeg or ffmpeg") from None
        return exe


def run_ffmpeg(*args: str) -> None:
    """Run ffmpeg quietly; raise with its stderr on failure."""
    cmd = [ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ffmpeg failed: {' '.join(cmd)}\n{p.stderr}")


def _src(duration: float, fps: float, w: int = W, h: int = H) -> list[str]:
    return ["-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate={fps}:duration={duration}"]


_X264 = ["-c:v", "libx264", "-preset", "ultrafast", "-g", "8", "-threads", "1"]  # single thread: bit-exact files


def make_testsrc_clip(path: Path, seconds: float, fps: float, w: int, h: int) -> Path:
    """``path``: ``seconds`` of testsrc2 at ``fps``, ``w`` x ``h``, H.264 (closed GOPs of 8, one thread), yuv420p."""
    run_ffmpeg(*_src(seconds, fps, w, h), *_X264, "-pix_fmt", "yuv420p", str(path))
    return path


class MediaFactory:
    """Makes each kind of odd media once into ``root`` (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Path] = {}

    def get(self, kind: str) -> Path:
        if kind not in self._cache:
            make = getattr(self, f"_make_{kind}", None)
            if make is None:
                raise KeyError(f"unknown media kind {kind!r}")
            self._cache[kind] = make()
        return self._cache[kind]

    # ------------------------------------------------------------------------------------------ well-formed
    def _make_good(self) -> Path:
        p = self.root / "good.mp4"
        run_ffmpeg(*_src(4, 8), *_X264, "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(p))
        return p

    def _make_good_moov_end(self) -> Path:
        p = self.root / "good_moov_end.mp4"
        run_ffmpeg(*_src(4, 8), *_X264, "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_pattern(self) -> Path:
        p = self.root / "pattern.mp4"
        # quadrants: top-left red, top-right green, bottom-left blue, bottom-right white
        src = ("color=c=red:s=32x24:r=4:d=2[a];color=c=lime:s=32x24:r=4:d=2[b];"
               "color=c=blue:s=32x24:r=4:d=2[c];color=c=white:s=32x24:r=4:d=2[d];"
               "[a][b]hstack[top];[c][d]hstack[bot];[top][bot]vstack")
        run_ffmpeg("-f", "lavfi", "-i", src, "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p",
                   "-qp", "0", str(p))
        return p

    def _make_rotated(self) -> Path:
        p = self.root / "rotated.mp4"
        run_ffmpeg("-display_rotation:v:0", "90", "-i", str(self.get("pattern")), "-c", "copy", str(p))
        return p

    def _make_single_frame(self) -> Path:
        p = self.root / "single_frame.mp4"
        run_ffmpeg(*_src(1, 8), *_X264, "-pix_fmt", "yuv420p", "-frames:v", "1", str(p))
        return p

    def _make_sub_step(self) -> Path:
        p = self.root / "sub_step.mp4"
        run_ffmpeg(*_src(0.4, 10), *_X264, "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_long_tiny(self) -> Path:
        p = self.root / "long_tiny.mp4"
        run_ffmpeg(*_src(1800, 1, 32, 24), "-c:v", "libx264", "-preset", "ultrafast", "-g", "30",
                   "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_vfr(self) -> Path:
        p = self.root / "vfr.mp4"
        # 20 frames 0.1 s apart, then 4 frames 1 s apart (times 0..1.9, 2, 3, 4, 5); the clip ends at 6 s
        expr = "if(lt(N,20),N*0.1,2+(N-20))/TB"
        run_ffmpeg(*_src(2.4, 10), "-vf", f"setpts='{expr}'", "-fps_mode", "passthrough", *_X264,
                   "-pix_fmt", "yuv420p", "-video_track_timescale", "1000", str(p))
        return p

    def _make_odd_dims(self) -> Path:
        p = self.root / "odd_dims.avi"
        run_ffmpeg(*_src(2, 4), "-vf", "scale=63:47,format=yuvj444p", "-c:v", "mjpeg", "-q:v", "3", str(p))
        return p

    def _make_yuv444(self) -> Path:
        p = self.root / "yuv444.mp4"
        run_ffmpeg(*_src(2, 4), *_X264, "-pix_fmt", "yuv444p", str(p))
        return p

    def _make_yuv420p10(self) -> Path:
        p = self.root / "yuv420p10.mp4"
        run_ffmpeg(*_src(2, 4), *_X264, "-pix_fmt", "yuv420p10le", str(p))
        return p

    def _make_mkv(self) -> Path:
        p = self.root / "clip.mkv"
        run_ffmpeg(*_src(2, 4), *_X264, "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_webm(self) -> Path:
        p = self.root / "clip.webm"
        run_ffmpeg(*_src(2, 4), "-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "100k",
                   "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_avi(self) -> Path:
        p = self.root / "clip.avi"
        run_ffmpeg(*_src(2, 4), "-c:v", "mpeg4", "-q:v", "5", "-pix_fmt", "yuv420p", str(p))
        return p

    def _make_unicode_path(self) -> Path:
        d = self.root / "vidéo 日本 ملف"
        d.mkdir(exist_ok=True)
        p = d / "clip with spaces é.mp4"
        shutil.copy(self.get("good"), p)
        return p

    def _make_uhd(self) -> Path:
        p = self.root / "uhd.mp4"
        run_ffmpeg("-f", "lavfi", "-i", "testsrc2=size=3840x2160:rate=5:duration=2", *_X264,
                   "-pix_fmt", "yuv420p", str(p))
        return p

    def clips(self, n: int) -> list[Path]:
        """``n`` distinct small H.264 clips (64x48, 2-4 s at 4 fps, different test patterns and durations)."""
        out = []
        for i in range(n):
            p = self.root / f"clip_{i}.mp4"
            if not p.exists():
                src = ["testsrc2", "smptebars", "rgbtestsrc", "mandelbrot"][i % 4]
                run_ffmpeg("-f", "lavfi", "-i", f"{src}=size={W}x{H}:rate=4", "-t", str(2 + i % 3), *_X264,
                           "-pix_fmt", "yuv420p", str(p))
            out.append(p)
        return out

    def indexed(self, duration: float, fps: float) -> Path:
        """A lossless 64x48 clip whose every frame is distinct: the left half's luma is ``16 + n mod 200``, the right
        half's ``16 + 40 * (n // 200)`` (frame ``n``), so a decoded frame tells which source frame it is
        (:func:`frame_numbers`). ``duration`` s at ``fps`` (CFR, starting at 0)."""
        p = self.root / f"indexed_{duration:g}s_{fps:g}fps.mp4"
        if not p.exists():
            geq = "geq=lum='if(lt(X\\,32)\\,16+mod(N\\,200)\\,16+40*floor(N/200))':cb=128:cr=128"
            run_ffmpeg("-f", "lavfi", "-i", f"color=black:s={W}x{H}:r={fps}:d={duration},format=yuv444p,{geq}",
                       "-c:v", "libx264", "-qp", "0", "-preset", "ultrafast", "-threads", "1", "-pix_fmt", "yuv444p",
                       str(p))
        return p

    def digits(self, duration: float, rate: str, codec: str = "x264", audio_s: float | None = None) -> Path:
        """A lossless 80x16 clip whose frame ``n`` shows ``n`` in base 16: block ``k`` (16 px wide) has luma
        ``16 + 13 * (n // 16**k % 16)`` (:func:`digit_indices` reads it back; 16**5 frames). ``rate`` as ffmpeg
        takes it (``30000/1001``); ``codec``: ``x264`` (mp4, ``-qp 0``, B-frames: pts out of decode order) or
        ``ffv1`` (mkv, time base 1/1000: rounded NTSC pts); ``audio_s``: add a silent AAC track this long."""
        name = f"digits_{duration:g}s_{rate.replace('/', '_')}_{codec}{'' if audio_s is None else f'_a{audio_s:g}'}"
        p = self.root / (name + (".mkv" if codec == "ffv1" else ".mp4"))
        if not p.exists():
            geq = "geq=lum='16+13*mod(floor(N/pow(16\\,floor(X/16)))\\,16)':cb=128:cr=128"
            src = ["-f", "lavfi", "-i", f"color=black:s=80x16:r={rate}:d={duration},format=yuv444p,{geq}"]
            if audio_s is not None:
                src += ["-f", "lavfi", "-i", f"anullsrc=r=8000:cl=mono:d={audio_s}", "-c:a", "aac", "-b:a", "8k"]
            enc = ["-c:v", "ffv1"] if codec == "ffv1" else ["-c:v", "libx264", "-qp", "0", "-preset", "veryfast",
                                                            "-bf", "3", "-threads", "1"]
            run_ffmpeg(*src, *enc, "-pix_fmt", "yuv444p", str(p))
        return p

    # ------------------------------------------------------------------------------------------ broken
    def _make_missing(self) -> Path:
        return self.root / "does_not_exist.mp4"

    def _make_zero_bytes(self) -> Path:
        p = self.root / "zero_bytes.mp4"
        p.write_bytes(b"")
        return p

    def _make_truncated(self) -> Path:
        data = self.get("good_moov_end").read_bytes()
        p = self.root / "truncated.mp4"
        p.write_bytes(data[: int(len(data) * 0.6)])
        return p

    def _make_truncated_tail(self) -> Path:
        data = self.get("good").read_bytes()
        p = self.root / "truncated_tail.mp4"
        p.write_bytes(data[: int(len(data) * 0.55)])
        return p

    def _make_corrupt_middle(self) -> Path:
        data = bytearray(self.get("good").read_bytes())
        rng = random.Random(8)
        mid = len(data) // 2
        data[mid: mid + 2048] = bytes(rng.randrange(256) for _ in range(2048))
        p = self.root / "corrupt_middle.mp4"
        p.write_bytes(bytes(data))
        return p

    def _make_intra_mkv(self) -> Path:
        p = self.root / "intra.mkv"
        run_ffmpeg(*_src(3, 8), "-c:v", "mjpeg", "-q:v", "3", str(p))
        return p

    def _make_pts_equal(self) -> Path:
        p = self.root / "pts_equal.mkv"
        run_ffmpeg("-i", str(self.get("intra_mkv")), "-c", "copy", "-bsf:v", "setts=ts=0", str(p))
        return p

    def _make_pts_backwards(self) -> Path:
        p = self.root / "pts_backwards.mkv"
        run_ffmpeg("-i", str(self.get("intra_mkv")), "-c", "copy", "-bsf:v", "setts=pts=(23-N)*125:dts=0", str(p))
        return p

    def _make_garbage(self) -> Path:
        rng = random.Random(9)
        p = self.root / "garbage.mp4"
        p.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
        return p

    def _make_audio_only(self) -> Path:
        p = self.root / "audio_only.mp4"
        run_ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=2", "-c:a", "aac", "-b:a", "32k", str(p))
        return p


def decode_with_ffmpeg(path: Path, width: int, height: int) -> "np.ndarray":  # noqa: F821
    """All frames of ``path`` as (T, H, W, 3) uint8 RGB via the ffmpeg CLI (autorotation on), for reference."""
    import numpy as np

    p = subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-i", str(path),
                        "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], capture_output=True, check=True)
    return np.frombuffer(p.stdout, np.uint8).reshape(-1, height, width, 3)


def ffmpeg_fps_filter(path: Path, fps: float, width: int, height: int) -> "np.ndarray":  # noqa: F821
    """The frames FFmpeg's ``fps`` filter with ``round=down`` emits at ``fps`` (seed 001's decode pipeline:
    ``ffmpeg.filter(stream, "fps", fps=fps, round="down")`` to rgb24), as (N, H, W, 3) uint8."""
    import numpy as np

    p = subprocess.run([ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-i", str(path),
                        "-vf", f"fps=fps={fps!r}:round=down", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                       capture_output=True, check=True)
    return np.frombuffer(p.stdout, np.uint8).reshape(-1, height, width, 3)


def seed_ffmpeg_command(path: Path, fps: float) -> list[str]:
    """Seed 001's ``decode_video`` pipeline as ffmpeg-python compiles it at native size: ``ffmpeg.input(path)``,
    ``ffmpeg.filter(stream, "fps", fps=fps, round="down")``, ``ffmpeg.output(stream, "pipe:", format="rawvideo",
    pix_fmt="rgb24")`` (ffmpeg-python writes the float with ``str``)."""
    return [ffmpeg_exe(), "-i", str(path), "-filter_complex", f"[0]fps=fps={fps}:round=down[s0]", "-map", "[s0]",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:"]


def digit_indices(frames: "np.ndarray") -> list[int]:  # noqa: F821
    """The source frame number each (T, 16, 80, 3) RGB frame of a :meth:`MediaFactory.digits` clip shows (the
    limited-range luma ``16 + 13 d`` is ``255 / 219 * 13 d`` in full-range RGB)."""
    import numpy as np

    blocks = frames[:, 4:12, :, 1].astype(np.float64).reshape(len(frames), 8, 5, 16)[:, :, :, 4:12].mean(axis=(1, 3))
    d = np.rint(blocks / (13 * 255 / 219)).astype(np.int64)
    return [int(sum(int(v) << (4 * k) for k, v in enumerate(row))) for row in d]


def seed_ffmpeg_indices(path: Path, fps: float) -> list[int]:
    """The source frame numbers seed 001's ffmpeg command (:func:`seed_ffmpeg_command`) emits for a digits clip."""
    import numpy as np

    p = subprocess.run(seed_ffmpeg_command(path, fps), capture_output=True, check=True)
    return digit_indices(np.frombuffer(p.stdout, np.uint8).reshape(-1, 16, 80, 3))


def frame_numbers(frames: "np.ndarray", reference: "np.ndarray") -> list[int]:  # noqa: F821
    """For each frame, the index of the identical-looking frame of ``reference`` (all source frames of an
    :meth:`MediaFactory.indexed` clip): the nearest one in mean absolute difference."""
    import numpy as np

    ref = reference.astype(np.int16)
    return [int(np.abs(ref - f.astype(np.int16)).mean(axis=(1, 2, 3)).argmin()) for f in frames]


if __name__ == "__main__":  # make every kind into ./_media for a look
    import sys

    f = MediaFactory(Path(sys.argv[1] if len(sys.argv) > 1 else "_media"))
    for name in sorted(n[6:] for n in dir(f) if n.startswith("_make_")):
        print(name, f.get(name), os.path.getsize(f.get(name)) if f.get(name).exists() else "-")
