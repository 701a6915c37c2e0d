"""EasyCom (Meta, 2021) release layout reader and a LightningDataModule streaming sessions for causal features.

Layout read (the public release, ``Main/`` folder)::

    <root>/Main/Video_Compressed/Session_<n>/<mm-ss-SSS>.mp4               1920x1080, 20 fps, ~1 min segments
    <root>/Main/Glasses_Microphone_Array_Audio/Session_<n>/<mm-ss-SSS>.wav 6 channels, 48 kHz
    <root>/Main/Speech_Transcriptions/Session_<n>/<mm-ss-SSS>.json         utterances (20 fps frame numbers)

A segment is named by its start time code ``mm-ss-SSS`` (minutes, seconds, milliseconds). **Session timeline**:
seconds of time code (segment ``01-00-000`` starts at 60.0 s), so the 5 Hz grid ``t_i = 0.2 (i + 1)`` and the
utterances of ``load_session_utterances`` share one clock. Consecutive segments may leave small gaps (a few
frames) and redacted minutes leave large ones.

**Gap policy** (``gap_policy``, ``max_gap_s``):
* ``"reset"`` (default): a gap longer than ``max_gap_s`` (1 s) ends the stream; the next segment starts a fresh
  stream (empty KV cache, TMRoPE restarting) whose start is moved up to the next 0.2 s grid point (the media before
  it is dropped) so its rows are rows of the session grid. Gaps up to ``max_gap_s`` are bridged: silence, and the
  last frame held.
* ``"bridge"``: every gap is bridged that way (one stream per session).
Overlapping segments (negative gaps) drop the overlapped start of the later segment. Session rows not covered by a
stream (before the first segment, inside a reset gap) are initialization rows (zeros, flagged) in the features.

Audio (read with numpy from the RIFF header, since the stdlib ``wave`` of Python 3.11 rejects the
WAVE_FORMAT_EXTENSIBLE headers of multichannel files): channels chosen by ``audio_channels`` (0-based; default ``(4, 5)``: the two in-ear binaural microphones of
the glasses, channels 5-6 in the release's 1-based numbering) are averaged, then resampled 48 kHz -> 16 kHz by a
*causal* windowed-sinc low-pass (63 taps, group delay 0.65 ms) and decimation, so no sample depends on later audio.
Video: right-edged 2 FPS: frame ``k`` of a stream is the last native frame fully shown at ``0.5 (k + 1)`` s
(native frame ``j`` of a segment shows ``[j / fps, (j + 1) / fps]``), decoded by decord at ``frame_height x
frame_width`` inside the DataLoader workers.
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from algorithms.errors import SettingError, check_int
from datamodules.decode import short_error
from datamodules.fork_context import fork_context
from datamodules.worker_watch import worker_init

log = logging.getLogger(__name__)

VIDEO_DIR = "Main/Video_Compressed"
AUDIO_DIR = "Main/Glasses_Microphone_Array_Audio"
TRANSCRIPT_DIR = "Main/Speech_Transcriptions"
TRANSCRIPT_FPS = 20.0
TARGET_SAMPLE_RATE = 16000
STREAM_FPS = 2.0
ROW_S = 0.2
GAP_POLICIES = ("reset", "bridge")
_TIME_CODE = re.compile(r"^(\d{2})-(\d{2})-(\d{3})$")


class EasyComFormatError(ValueError):
    """The folder does not follow the EasyCom release layout (path named)."""


def parse_time_code(name: str | Path, kind: str = "segment") -> float:
    """``"mm-ss-SSS"`` (file stem of a name or path) -> seconds. Raises EasyComFormatError on other names (the
    message starts with ``name`` as given: pass the path to have it named, ``kind`` says what the file is)."""
    m = _TIME_CODE.match(Path(name).stem)
    if not m:
        raise EasyComFormatError(f"{name}: {kind} name is not a mm-ss-SSS time code")
    return int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1000.0


def format_time_code(seconds: float) -> str:
    """Seconds -> ``"mm-ss-SSS"``."""
    ms = int(round(seconds * 1000))
    return f"{ms // 60000:02d}-{(ms // 1000) % 60:02d}-{ms % 1000:03d}"


@dataclass(frozen=True)
class Utterance:
    """One transcribed utterance on the session timeline.

    Attributes:
        start_s, end_s: seconds on the session timeline: segment time code + ``Start_Frame / 20`` (resp.
            ``End_Frame / 20``); frame numbers are read as time stamps at 20 fps.
        participant_id: ``Participant_ID`` as int.
        text: ``Transcription``.
        target_of_speech: ``Target_of_Speech`` exactly as in the file (passed through; ``None`` if absent).
        segment: the segment's time code name.
    """

    start_s: float
    end_s: float
    participant_id: int
    text: str
    target_of_speech: Any = None
    segment: str = ""


@dataclass(frozen=True)
class Segment:
    """One time-coded segment of a session (paths may be missing for transcripts)."""

    name: str
    start_s: float
    video: Path
    audio: Path
    transcript: Path | None


@dataclass
class StreamPlan:
    """One continuous stream of a session: ``pieces`` placed on the session timeline from ``start_s``.

    Attributes:
        start_s: stream start on the session timeline (a multiple of 0.2 s).
        end_s: end of the last piece.
        pieces: ``(segment, from_s, session_s, duration_s)``: ``duration_s`` of ``segment`` starting ``from_s`` into
            it, placed at ``session_s``.
    """

    start_s: float
    end_s: float
    pieces: list[tuple[Segment, float, float, float]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def list_sessions(root: str | Path) -> list[str]:
    """``Session_<n>`` folders under ``Main/Video_Compressed``, in numeric order."""
    base = Path(root) / VIDEO_DIR
    if not base.is_dir():
        raise EasyComFormatError(f"{base}: missing (expected the EasyCom release layout)")
    names = [p.name for p in base.iterdir() if p.is_dir() and p.name.startswith("Session_")]
    return sorted(names, key=lambda s: (int(re.sub(r"\D", "", s) or 0), s))


_NAMED_ORPHANS: set[str] = set()   # orphan-wav lines already printed by this process (and its forked workers)


def list_segments(root: str | Path, session: str) -> list[Segment]:
    """Segments of ``session`` in time-code order; every video needs its wav (EasyComFormatError otherwise); a wav
    without its video is left out with a console line naming it (logged once per folder and set of wavs)."""
    root = Path(root)
    folder = root / VIDEO_DIR / session
    if not folder.is_dir():
        raise EasyComFormatError(f"{folder}: session folder missing")
    audio = root / AUDIO_DIR / session
    mp4s, wavs = list(folder.glob("*.mp4")), list(audio.glob("*.wav"))
    for p in mp4s + wavs:
        if not p.is_file():
            raise EasyComFormatError(f"{p}: a directory, not a segment file")
    vids = sorted((parse_time_code(v), v) for v in mp4s)
    if not vids:
        raise EasyComFormatError(f"{folder}: no mm-ss-SSS.mp4 segments")
    orphans = sorted(w.name for w in wavs if not (folder / f"{w.stem}.mp4").is_file())
    msg = f"{audio}: {', '.join(orphans)} without a video in {folder}; those segments are left out of the session"
    if orphans and msg not in _NAMED_ORPHANS:   # one console line per folder, however often it is listed
        _NAMED_ORPHANS.add(msg)
        log.warning(msg)
    out = []
    for start, v in vids:
        wav = audio / f"{v.stem}.wav"
        if not wav.is_file():
            raise EasyComFormatError(f"{wav}: missing audio for {v}")
        js = root / TRANSCRIPT_DIR / session / f"{v.stem}.json"
        out.append(Segment(v.stem, start, v, wav, js if js.is_file() else None))
    return out


def _read_transcript(path: Path) -> list[dict]:
    """The utterance dicts of one transcript file: a list, or a dict wrapping one (``{"utterances": [...]}``).

    Raises:
        EasyComFormatError: not valid JSON, or neither a list nor a dict holding one (file named).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EasyComFormatError(f"{path}: not valid JSON ({e})") from e
    if isinstance(data, dict):  # tolerate {"utterances": [...]}-style wrappers
        lists = [v for v in data.values() if isinstance(v, list)]
        if not lists:
            raise EasyComFormatError(f"{path}: expected a list of utterances, got an object without a list "
                                     f"(keys {sorted(data)[:5]})")
        data = lists[0]
    if not isinstance(data, list):
        raise EasyComFormatError(f"{path}: expected a list of utterances, got {type(data).__name__}")
    return data


def load_session_utterances(root: str | Path, session: str) -> list[Utterance]:
    """All utterances of ``session`` on the session timeline, sorted by start time.

    Raises:
        EasyComFormatError: ``root`` or the session's transcript folder is missing, the folder has no ``*.json``
            transcript, or a transcript is not a list of utterances, lacks ``Start_Frame``, ``End_Frame`` or
            ``Participant_ID``, or has an utterance whose ``End_Frame`` is before its ``Start_Frame`` (file and
            utterance index named).
    """
    root = Path(root)
    folder = root / TRANSCRIPT_DIR / session
    if not root.is_dir():
        raise EasyComFormatError(f"{root}: no such folder (expected the EasyCom root holding {TRANSCRIPT_DIR})")
    if not folder.is_dir():
        raise EasyComFormatError(f"{folder}: transcript folder of {session} missing")
    files = sorted((parse_time_code(p, "transcript"), p) for p in folder.glob("*.json"))
    if not files:
        raise EasyComFormatError(f"{folder}: no mm-ss-SSS.json transcripts")
    out = []
    for offset, js in files:
        for k, u in enumerate(_read_transcript(js)):
            try:
                start, end, pid = float(u["Start_Frame"]), float(u["End_Frame"]), int(u["Participant_ID"])
            except (KeyError, TypeError, ValueError) as e:
                raise EasyComFormatError(f"{js}: utterance {k} lacks Start_Frame/End_Frame/Participant_ID ({e})")
            if end < start:
                raise EasyComFormatError(f"{js}: utterance {k} ends before it starts (Start_Frame {u['Start_Frame']}, "
                                         f"End_Frame {u['End_Frame']})")
            out.append(Utterance(start_s=offset + start / TRANSCRIPT_FPS, end_s=offset + end / TRANSCRIPT_FPS,
                                 participant_id=pid, text=str(u.get("Transcription", "")),
                                 target_of_speech=u.get("Target_of_Speech"), segment=js.stem))
    return sorted(out, key=lambda u: (u.start_s, u.end_s, u.participant_id))


def _ceil_grid(t: float, step: float = ROW_S) -> float:
    return round(math.ceil(round(t / step, 6)) * step, 6)


def plan_streams(segments: list[Segment], durations_s: list[float], gap_policy: str = "reset",
                 max_gap_s: float = 1.0) -> list[StreamPlan]:
    """Place segments on the session timeline and cut them into streams by the gap policy (module docstring).

    Raises:
        ValueError: unknown ``gap_policy``.
    """
    if gap_policy not in GAP_POLICIES:
        raise ValueError(f"gap_policy={gap_policy!r}; expected one of {GAP_POLICIES}")
    streams: list[StreamPlan] = []
    cur: StreamPlan | None = None
    for seg, dur in zip(segments, durations_s):
        seg_end = seg.start_s + dur
        if cur is not None:
            gap = seg.start_s - cur.end_s
            if gap > max_gap_s and gap_policy == "reset":
                streams.append(cur)
                cur = None
            else:
                skip = max(0.0, -gap)  # overlap: drop the start of the later segment
                if dur - skip > 0:
                    cur.pieces.append((seg, skip, seg.start_s + skip, dur - skip))
                    cur.end_s = max(cur.end_s, seg_end)
                continue
        start = _ceil_grid(seg.start_s)
        skip = start - seg.start_s
        if dur - skip <= 0:
            continue
        cur = StreamPlan(start_s=start, end_s=seg_end, pieces=[(seg, skip, start, dur - skip)])
    if cur is not None:
        streams.append(cur)
    return streams


# ------------------------------------------------------------------------------------------------ decoding
def causal_lowpass_taps(cutoff: float, num_taps: int = 63) -> np.ndarray:
    """Windowed-sinc (Hamming) low-pass taps, ``cutoff`` in cycles/sample (0.5 = Nyquist); unit DC gain."""
    n = np.arange(num_taps) - (num_taps - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(num_taps)
    return (h / h.sum()).astype(np.float64)


def resample_causal(x: np.ndarray, sr_in: int, sr_out: int = TARGET_SAMPLE_RATE, num_taps: int = 63) -> np.ndarray:
    """(S_in,) -> (S_in * sr_out / sr_in,) float32 by causal FIR low-pass + integer decimation.

    Output sample ``n`` depends on input up to its own time only (plus the filter's fixed group delay of
    ``(num_taps - 1) / 2 / sr_in`` s). Raises ValueError unless ``sr_in`` is an integer multiple of ``sr_out``.
    """
    if sr_in == sr_out:
        return x.astype(np.float32)
    if sr_in % sr_out:
        raise ValueError(f"cannot decimate {sr_in} Hz to {sr_out} Hz by an integer factor")
    q = sr_in // sr_out
    h = causal_lowpass_taps(0.5 / q * 0.9, num_taps)
    y = np.convolve(x.astype(np.float64), h)[: len(x)]  # causal: y[n] = sum_k h[k] x[n - k]
    return y[::q].astype(np.float32)


def _wav_layout(path: Path) -> tuple[int, int, int, int, int, int]:
    """Parse a RIFF/WAVE header (plain PCM, IEEE float, or WAVE_FORMAT_EXTENSIBLE, which the stdlib ``wave`` of
    Python 3.11 rejects but ffmpeg writes for more than two channels).

    Returns:
        (sample_rate, channels, bytes_per_sample, format (1 PCM / 3 float), data_offset, data_bytes).
    Raises:
        EasyComFormatError: not a PCM/float WAVE file, or a truncated one.
    """
    import struct

    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            raise EasyComFormatError(f"{path}: not a RIFF/WAVE file")
        fmt = None
        while True:
            ch = f.read(8)
            if len(ch) < 8:
                raise EasyComFormatError(f"{path}: no data chunk")
            cid, size = ch[:4], struct.unpack("<I", ch[4:])[0]
            if cid == b"fmt ":
                body = f.read(size + (size & 1))
                if len(body) < 16:
                    raise EasyComFormatError(f"{path}: truncated fmt chunk ({len(body)} of 16 bytes)")
                tag, nch, sr, _, _, bits = struct.unpack("<HHIIHH", body[:16])
                if tag == 0xFFFE and size >= 40:
                    tag = struct.unpack("<H", body[24:26])[0]  # SubFormat GUID starts with the format tag
                if tag not in (1, 3):
                    raise EasyComFormatError(f"{path}: unsupported WAVE format tag {tag}")
                if nch < 1 or sr < 1 or bits < 8 or bits % 8:
                    raise EasyComFormatError(f"{path}: invalid fmt chunk ({nch} channels, {sr} Hz, {bits} bits)")
                fmt = (sr, nch, bits // 8, tag)
            elif cid == b"data":
                if fmt is None:
                    raise EasyComFormatError(f"{path}: data chunk before fmt chunk")
                held = path.stat().st_size - f.tell()
                if held < size:
                    raise EasyComFormatError(f"{path}: truncated: the data chunk declares {size} bytes, the file "
                                             f"holds {held}")
                return (*fmt, f.tell(), size)
            else:
                f.seek(size + (size & 1), 1)


def read_wav_mono(path: Path, channels: tuple[int, ...] | None, start_s: float = 0.0,
                  duration_s: float | None = None) -> tuple[np.ndarray, int]:
    """Read ``duration_s`` from ``start_s`` of a WAVE file (numpy memmap) and average ``channels`` (None: all).

    Returns:
        (S,) float32 in [-1, 1], sample rate.
    Raises:
        EasyComFormatError: unsupported encoding or a channel index out of range.
    """
    sr, nch, width, tag, offset, nbytes = _wav_layout(path)
    nframes = nbytes // (width * nch)
    a = min(nframes, int(round(start_s * sr)))
    n = nframes - a if duration_s is None else min(nframes - a, int(round(duration_s * sr)))
    dtypes = {(1, 2): "<i2", (1, 4): "<i4", (3, 4): "<f4", (3, 8): "<f8"}
    chans = list(range(nch)) if channels is None else list(channels)
    if any(c < 0 or c >= nch for c in chans):
        raise EasyComFormatError(f"{path}: audio_channels {chans} out of range for {nch} channels")
    if (tag, width) in dtypes:
        mm = np.memmap(path, dtype=dtypes[(tag, width)], mode="r", offset=offset + a * width * nch, shape=(n, nch))
        data = np.asarray(mm[:, chans], dtype=np.float32)
        if tag == 1:
            data /= float(2 ** (8 * width - 1))
    elif (tag, width) == (1, 3):
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset + a * 3 * nch, shape=(n, nch, 3))
        b = np.asarray(raw[:, chans], dtype=np.int32)
        v = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        data = (np.where(v >= 1 << 23, v - (1 << 24), v) / float(1 << 23)).astype(np.float32)
    else:
        raise EasyComFormatError(f"{path}: unsupported sample format (tag {tag}, {width} bytes)")
    if tag == 3 and not np.isfinite(data).all():
        bad = int((~np.isfinite(data)).any(axis=1).sum())
        raise EasyComFormatError(f"{path}: {bad} samples are NaN or infinite")
    return data.mean(axis=1), sr


def video_info(path: Path) -> tuple[float, int, float]:
    """(fps, frame count, duration s) from decord."""
    import decord

    try:
        vr = decord.VideoReader(str(path), num_threads=1)
        fps = float(vr.get_avg_fps())
        return fps, len(vr), len(vr) / fps
    except Exception as e:  # noqa: BLE001 - decord raises RuntimeError / DECORDError: name the file
        raise EasyComFormatError(f"{path}: cannot open the video ({short_error(e)})") from e


def decode_stream(plan: StreamPlan, audio_channels: tuple[int, ...] | None = (4, 5),
                  frame_height: int | None = 252, frame_width: int | None = 448,
                  fps: float = STREAM_FPS) -> dict[str, Any]:
    """Decode one stream: right-edged ``fps`` frames and 16 kHz mono audio, both from the stream start.

    Returns:
        ``{"start_s", "duration_s", "frames": uint8 (F, H, W, 3), "audio": float32 (S,),
        "frame_times": float32 (F,) session-timeline right edges}`` with ``F = floor(duration * fps)``,
        ``S = round(duration * 16000)``. Frames falling in a bridged gap repeat the last decoded frame.
    """
    import decord

    dur = plan.duration_s
    n_frames = int(math.floor(dur * fps + 1e-6))
    n_samples = int(round(dur * TARGET_SAMPLE_RATE))
    audio = np.zeros(n_samples, dtype=np.float32)
    for seg, from_s, session_s, d in plan.pieces:
        x, sr = read_wav_mono(seg.audio, audio_channels, from_s, d)
        y = resample_causal(x, sr)
        o = int(round((session_s - plan.start_s) * TARGET_SAMPLE_RATE))
        y = y[: max(0, n_samples - o)]
        audio[o: o + len(y)] = y
    # which native frame of which segment is the last one fully shown at each right edge
    wanted: list[tuple[int, int] | None] = []
    readers: dict[int, Any] = {}
    for k in range(n_frames):
        tau = plan.start_s + (k + 1) / fps
        hit = None
        for p, (seg, from_s, session_s, d) in enumerate(plan.pieces):
            if session_s - 1e-9 < tau <= session_s + d + 1e-6:
                if p not in readers:
                    kw = {} if frame_height is None else {"height": frame_height, "width": frame_width}
                    try:
                        readers[p] = decord.VideoReader(str(seg.video), num_threads=1, **kw)
                    except Exception as e:  # noqa: BLE001 - name the file
                        raise EasyComFormatError(f"{seg.video}: cannot open the video ({short_error(e)})") from e
                vr = readers[p]
                j = int(round((tau - seg.start_s) * float(vr.get_avg_fps()))) - 1
                if j >= 0:
                    hit = (p, min(j, len(vr) - 1))
                break
        wanted.append(hit)
    frames = None
    last = None
    out = []
    for hit in wanted:
        if hit is not None:
            try:
                last = readers[hit[0]][hit[1]].asnumpy()
            except Exception as e:  # noqa: BLE001 - a corrupt packet: name the file and the frame
                raise EasyComFormatError(f"{plan.pieces[hit[0]][0].video}: cannot decode frame {hit[1]} "
                                         f"({short_error(e)})") from e
        if last is None:  # nothing shown yet: black frame of the decode size
            h, w = (frame_height, frame_width) if frame_height else (1080, 1920)
            last = np.zeros((h, w, 3), dtype=np.uint8)
        out.append(last)
    if out:
        frames = np.stack(out)
    else:
        h, w = (frame_height, frame_width) if frame_height else (1080, 1920)
        frames = np.zeros((0, h, w, 3), dtype=np.uint8)
    return {"start_s": plan.start_s, "duration_s": dur, "frames": torch.from_numpy(frames),
            "audio": torch.from_numpy(audio),
            "frame_times": torch.tensor([plan.start_s + (k + 1) / fps for k in range(n_frames)], dtype=torch.float32)}


class EasyComSessionStreams(Dataset):
    """One item per session: its streams decoded (in the DataLoader worker), see ``decode_stream``.

    Item: ``{"session": str, "timeline_end_s": float, "streams": [decode_stream(...), ...],
    "gap_policy": str, "segments": [names]}``, or ``{"session": str, "error": str}`` when a file of the session
    cannot be read (the error names it).
    """

    def __init__(self, root: str | Path, sessions: list[str] | None = None, gap_policy: str = "reset",
                 max_gap_s: float = 1.0, audio_channels: tuple[int, ...] | None = (4, 5),
                 frame_height: int | None = 252, frame_width: int | None = 448, max_duration_s: float | None = None):
        if gap_policy not in GAP_POLICIES:
            raise ValueError(f"gap_policy={gap_policy!r}; expected one of {GAP_POLICIES}")
        self.root = Path(root)
        self.sessions = list(sessions) if sessions else list_sessions(self.root)
        missing = [x for x in self.sessions if not (self.root / VIDEO_DIR / x).is_dir()]
        if missing:   # a typo in the session list is a setting error, not a failed session
            raise EasyComFormatError(f"{self.root / VIDEO_DIR}: no folder for sessions {missing}")
        if not self.sessions:
            raise EasyComFormatError(f"{self.root / VIDEO_DIR}: no Session_<n> folders (nothing to extract)")
        self.gap_policy, self.max_gap_s = gap_policy, max_gap_s
        self.audio_channels = None if audio_channels is None else tuple(audio_channels)
        self._check_channels()
        self.frame_height, self.frame_width = frame_height, frame_width
        self.max_duration_s = max_duration_s

    def _check_channels(self) -> None:
        """``audio_channels`` against the first readable wav: a wrong index is a setting (SettingError now), not a
        failure of every session later. An unreadable first session is left to its own error record."""
        if self.audio_channels is None:
            return
        for session in self.sessions[:1]:
            try:
                wav = next((seg.audio for seg in list_segments(self.root, session)), None)
                nch = _wav_layout(wav)[1] if wav is not None else None
            except EasyComFormatError:
                return
            bad = [c for c in self.audio_channels if not 0 <= c < (nch or 0)]
            if nch is not None and bad:
                raise SettingError(f"data.init_args.audio_channels={list(self.audio_channels)}: {wav} has {nch} "
                                   f"channels (0-based indices 0..{nch - 1}), so {bad} do not exist")

    def __len__(self) -> int:
        return len(self.sessions)

    def plan(self, session: str, segs: list[Segment] | None = None) -> list[StreamPlan]:
        """The session's stream plans (``segs``: its :func:`list_segments`, when the caller already has them)."""
        segs = list_segments(self.root, session) if segs is None else segs
        durs = [min(video_info(s.video)[2], _wav_duration(s.audio)) for s in segs]
        plans = plan_streams(segs, durs, self.gap_policy, self.max_gap_s)
        if self.max_duration_s is not None:  # keep the session timeline up to max_duration_s
            kept = []
            for p in plans:
                if p.start_s >= self.max_duration_s:
                    break
                if p.end_s > self.max_duration_s:
                    p.end_s = self.max_duration_s
                    p.pieces = [(s, f, t, min(d, self.max_duration_s - t)) for s, f, t, d in p.pieces
                                if t < self.max_duration_s]
                kept.append(p)
            plans = kept
        return plans

    def __getitem__(self, i: int) -> dict[str, Any]:
        """The decoded session, or ``{"session", "error"}`` when one of its files cannot be read (the message names
        the file; the extractor records it and the run goes on)."""
        session = self.sessions[i]
        try:
            return self._decode(session)
        except (ImportError, MemoryError):   # the host, not the session: every session would fail the same way
            raise
        except Exception as e:  # noqa: BLE001 - one bad file must not end a long extraction
            msg = str(e) if isinstance(e, EasyComFormatError) else f"{type(e).__name__}: {e}"
            return {"session": session, "error": msg}

    def _decode(self, session: str) -> dict[str, Any]:
        segs = list_segments(self.root, session)   # listed once: it checks every file and warns on orphans
        plans = self.plan(session, segs)
        streams = [decode_stream(p, self.audio_channels, self.frame_height, self.frame_width) for p in plans]
        return {"session": session, "timeline_end_s": max((p.end_s for p in plans), default=0.0),
                "streams": streams, "gap_policy": self.gap_policy, "segments": [s.name for s in segs]}


def _wav_duration(path: Path) -> float:
    sr, nch, width, _, _, nbytes = _wav_layout(path)
    return nbytes // (width * nch) / sr


class EasyComStreamDataModule(LightningDataModule):
    """Streams EasyCom sessions (one batch = one session, no collation) for ``trainer.predict``.

    Args:
        root: dataset root holding ``Main/``.
        sessions: session folder names (default: all).
        gap_policy / max_gap_s: see the module docstring (default reset after a gap over 1 s).
        audio_channels: 0-based wav channels averaged to mono (default the two in-ear channels ``(4, 5)``).
        frame_height / frame_width: decode size (None: native 1920x1080).
        max_duration_s: truncate each session timeline (demo / debugging).
        num_workers: DataLoader workers that decode.
        sessions_per_batch: sessions handed to the extractor together (a list per batch when > 1; set the
            extractor's ``sessions_per_batch`` to the same value to run them in lockstep).
    """

    def __init__(self, root: str, sessions: list[str] | None = None, gap_policy: str = "reset",
                 max_gap_s: float = 1.0, audio_channels: list[int] | None = (4, 5), frame_height: int | None = 252,
                 frame_width: int | None = 448, max_duration_s: float | None = None, num_workers: int = 0,
                 sessions_per_batch: int = 1):
        super().__init__()
        for name, value, low in (("sessions_per_batch", sessions_per_batch, 1), ("num_workers", num_workers, 0)):
            check_int(f"data.init_args.{name}", value, low)
        self.save_hyperparameters()
        self.dataset: EasyComSessionStreams | None = None

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        self.dataset = EasyComSessionStreams(hp.root, hp.sessions, hp.gap_policy, hp.max_gap_s, hp.audio_channels,
                                             hp.frame_height, hp.frame_width, hp.max_duration_s)

    def predict_dataloader(self) -> DataLoader:
        if self.dataset is None:
            self.setup("predict")
        n = self.hparams.sessions_per_batch
        workers = self.hparams.num_workers
        context = fork_context() if workers > 0 else None   # the parent's garbage collected before each fork
        if n > 1:
            return DataLoader(self.dataset, batch_size=n, collate_fn=list, shuffle=False, num_workers=workers,
                              persistent_workers=False, multiprocessing_context=context,
                              worker_init_fn=worker_init(workers))
        return DataLoader(self.dataset, batch_size=None, shuffle=False, num_workers=workers,
                          persistent_workers=False, multiprocessing_context=context,
                          worker_init_fn=worker_init(workers))
