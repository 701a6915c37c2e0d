"""Write a small EasyCom-layout dataset from the bundled real media (tests and the demo).

``python -m datamodules.easycom_fixture <out_root> [--width 1920 --height 1080]``

Uses the ffmpeg binary bundled with ``imageio-ffmpeg``. Media: ``assets/media/cockatoo.mp4`` and
``realshort.mp4`` (public domain, see ``assets/media/README.md``). Written (the release layout exactly)::

    Main/Video_Compressed/Session_1/00-00-000.mp4   cockatoo 0-4 s
    Main/Video_Compressed/Session_1/00-04-300.mp4   cockatoo 4-8 s   (0.3 s gap: bridged by default)
    Main/Video_Compressed/Session_1/00-10-000.mp4   cockatoo 8-12 s  (1.7 s gap: stream reset by default)
    Main/Video_Compressed/Session_2/00-00-000.mp4   realshort 0-1.2 s
    Main/Glasses_Microphone_Array_Audio/Session_<n>/<same>.wav   6 channels, 48 kHz, s16: realshort.mp4's mono
        sound looped (cockatoo.mp4's own soundtrack is silent) at gains ``CHANNEL_GAINS``
    Main/Speech_Transcriptions/Session_<n>/<same>.json           synthetic utterances (fixture text, not real)

Videos are 20 fps h264 yuv420p at ``--width x --height`` (default 1920x1080, as the release).
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

MEDIA = Path(__file__).resolve().parent.parent / "assets" / "media"

# session -> [(segment time code, video source, source start s, duration s, sound source)]
# cockatoo.mp4's own soundtrack is digital silence (-91 dB), so Session_1 carries realshort.mp4's sound, looped.
FIXTURE_SESSIONS: dict[str, list[tuple[str, str, float, float, str]]] = {
    "Session_1": [("00-00-000", "cockatoo.mp4", 0.0, 4.0, "realshort.mp4"),
                  ("00-04-300", "cockatoo.mp4", 4.0, 4.0, "realshort.mp4"),
                  ("00-10-000", "cockatoo.mp4", 8.0, 4.0, "realshort.mp4")],
    "Session_2": [("00-00-000", "realshort.mp4", 0.0, 1.2, "realshort.mp4")],
}
CHANNEL_GAINS = (0.25, 0.5, 0.75, 1.0, 1.0, 0.9)  # channels 0-3 "array", 4-5 "in-ear"
# synthetic utterances per segment: (Start_Frame, End_Frame, Participant_ID, Transcription, Target_of_Speech)
_UTTERANCES = [(4, 30, 2, "fixture utterance one", 3), (34, 70, 3, "fixture utterance two", 2)]


def _ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def write_segment(src: Path, start_s: float, dur_s: float, video_out: Path, wav_out: Path, width: int,
                  height: int, audio_src: Path | None = None) -> None:
    """Cut ``[start_s, start_s + dur_s)`` of ``src`` into an EasyCom-like mp4 (20 fps) and a 6-channel 48 kHz wav.

    The sound comes from ``audio_src`` (default ``src``), looped, from the same offset, padded to ``dur_s``.
    Seeking is done on the output side with one decoder thread: the bundled decoder corrupts
    ``cockatoo.mp4`` (h264 High 4:4:4) when it seeks into it or decodes it with frame threads.
    """
    ff = _ffmpeg()
    video_out.parent.mkdir(parents=True, exist_ok=True)
    wav_out.parent.mkdir(parents=True, exist_ok=True)
    quiet = [ff, "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]
    cut = ["-ss", f"{start_s:.3f}", "-t", f"{dur_s:.3f}"]
    subprocess.run(quiet + ["-threads", "1", "-i", str(src)] + cut +
                   ["-an", "-vf", f"fps=20,scale={width}:{height}", "-c:v", "libx264", "-preset", "ultrafast",
                    "-crf", "28", "-pix_fmt", "yuv420p", str(video_out)], check=True)
    pan = "pan=6c|" + "|".join(f"c{c}={g:g}*c0" for c, g in enumerate(CHANNEL_GAINS))
    subprocess.run(quiet + ["-stream_loop", "-1", "-i", str(audio_src or src)] + cut +
                   ["-vn", "-af", f"aformat=channel_layouts=mono,{pan},apad", "-ar", "48000", "-c:a", "pcm_s16le",
                    str(wav_out)], check=True)


def build_easycom_fixture(out_root: str | Path, width: int = 1920, height: int = 1080,
                          sessions: dict[str, list[tuple[str, str, float, float, str]]] | None = None) -> Path:
    """Write the fixture dataset under ``out_root`` (see module docstring); returns ``out_root``."""
    root = Path(out_root)
    for session, segs in (sessions or FIXTURE_SESSIONS).items():
        for code, src, a, d, sound in segs:
            write_segment(MEDIA / src, a, d, root / "Main/Video_Compressed" / session / f"{code}.mp4",
                          root / "Main/Glasses_Microphone_Array_Audio" / session / f"{code}.wav", width, height,
                          MEDIA / sound)
            max_frame = int(d * 20) - 1
            utts = [{"Start_Frame": s, "End_Frame": min(e, max_frame), "Participant_ID": p, "Transcription": t,
                     "Target_of_Speech": tgt} for s, e, p, t, tgt in _UTTERANCES if s < max_frame]
            js = root / "Main/Speech_Transcriptions" / session / f"{code}.json"
            js.parent.mkdir(parents=True, exist_ok=True)
            js.write_text(json.dumps(utts, indent=1))
    return root


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_root")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    args = ap.parse_args(argv)
    print(build_easycom_fixture(args.out_root, args.width, args.height))


if __name__ == "__main__":
    main()
