"""Long benchmark videos made from the bundled public-domain clips (looped, re-encoded with ffmpeg from
imageio-ffmpeg), for ``bench/qa_throughput.py``:

    python bench/make_media.py            # writes bench/media/{cockatoo_180s,desk_240s,cockatoo_120s_flip}.mp4

The files are ignored by git (about 21 MB); the bench carries them to the GPU machine.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import imageio_ffmpeg

REPO = Path(__file__).resolve().parent.parent
MEDIA = REPO / "assets" / "media"
# name: (source clip, loops, ffmpeg video filter, crf, seconds)
VIDEOS = {
    "cockatoo_180s.mp4": ("cockatoo.mp4", 12, "scale=960:540,format=yuv420p", 32, 180),
    "cockatoo_120s_flip.mp4": ("cockatoo.mp4", 8, "scale=640:360,hflip,format=yuv420p", 32, 120),
    "desk_240s.mp4": ("realshort.mp4", 199, "scale=640:480,format=yuv420p", 30, 240),
}


def main(out_dir: Path = REPO / "bench" / "media") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    made = []
    for name, (src, loops, vf, crf, seconds) in VIDEOS.items():
        out = out_dir / name
        if not out.is_file():
            subprocess.run([ffmpeg, "-v", "error", "-y", "-stream_loop", str(loops), "-i", str(MEDIA / src), "-an",
                            "-vf", vf, "-c:v", "libx264", "-preset", "veryfast", "-crf", str(crf), "-t", str(seconds),
                            str(out)], check=True)
        made.append(out)
        print(out)
    return made


if __name__ == "__main__":
    main()
