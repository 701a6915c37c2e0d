"""One long video decoded as several parts, in several processes, and joined back (``data.decode_part_mb``).

Why. NVDEC sessions that one process opens serialise inside the decoding library or driver: the 30-minute 1080p
H.264 video of ``bench/workload.py`` took 18.1 s with 8 sessions in one process on the H100 (engines 47 % busy),
12.4-13.3 s as 4 or 8 parts in as many processes (68 %; ``bench/nvdec_split_probe.py``,
``bench/results/s5call1_split_h100_2026-12-06.txt``). So the run's decode workers take a long video's parts as
separate items and the main process joins them (:class:`datamodules.part_join.JoiningLoader`) before the step.

What a part is. The video's plan (:func:`datamodules.decode.plan_decode`: seed 001's frame choice) is made whole in
every part, then part ``k`` of ``K`` decodes the planned positions ``[k T // K, (k + 1) T // K)`` (:func:`part_bounds`)
with the reader the whole video would use; the frames held at the encoder's sizes are the whole video's grids
restricted to the part (:func:`part_grids`: the grid of a frame depends on the whole video's frame count).

Why a part's frames are the whole decode's. The NVDEC reader feeds each session the packets the sampled frames need
back to their IDR picture (:mod:`datamodules.decode.packet_filter`, whose exactness the tests prove against FFmpeg's
decoder fed the same packets) and cuts a video's sessions at IDR periods: a part is one more such cut, and its first
frame is decoded from the same IDR as in the whole decode. That is the reader the parts run on (``decode_part_mb``
splits only where NVDEC may decode). A reader that seeks to the container's key frames (decord, and NVDEC's
``SimpleDecoder`` fallback for VP9 or a failed scan) gives the same frames only where every key frame is a clean
start: on a stream whose key frames are not (``assets/media/cockatoo.mp4``: the frames after a mid-stream key frame
differ from a decode from the start), the CPU readers' concealment pass flags the part's frames, and the join
decodes the video whole instead (below); NVDEC's ``SimpleDecoder`` path, which reports no flags, carries the same
risk in a whole video's sessions today.

:func:`join_frames` and :func:`join_info` put the parts back: the frames, labels and ``video_info`` equal the whole
decode's (``tests/datamodules/test_decode_parts.py`` checks it on the CPU readers), with one exception that the join
states: when the parts did not all use the same reader (a part fell back to the CPU), ``decoder`` /
``decoder_fallback`` are the first such part's. Parts that cannot be shown equal (a part re-planned, or read damaged
frames on the CPU) raise :class:`PartMismatch`, and the video is decoded whole.

When not to split. The replacement rule (``max_replaced_frac > 0``) picks a neighbour across the whole video, and
``strict_frames`` decodes on the CPU; a run with either decodes whole (``datamodules.videoqa``). Pure: no I/O.
"""
from __future__ import annotations

import torch

from datamodules.decode.held import EncoderFrames
from datamodules.decode.plan import DecodePlan

# ``video_info`` keys set by the plan (equal in every part of one video, else the parts planned differently)
PLAN_KEYS = ("duration_s", "native_hw", "decode_hw", "n_frames", "fps", "sample_fps", "fps_ok", "vfr",
             "timestamps_unusable", "timestamps_from_decoder")
# every ``video_info`` key, in the order :func:`datamodules.decode.decode_video` sets them
INFO_ORDER = ("duration_s", "native_hw", "decode_hw", "n_frames", "fps", "sample_fps", "fps_ok", "vfr", "decoder",
              "decoder_fallback", "timestamps_unusable", "timestamps_from_decoder", "frames_replaced",
              "frames_concealed", "concealment_checked")
# keys listing positions in the returned frames (each part's are its own: shifted by its first position)
POSITION_KEYS = ("frames_replaced", "frames_concealed")


class PartMismatch(ValueError):
    """The parts of one video do not fit together (different plans, a gap or overlap): decode it whole."""


def part_bounds(num_frames: int, part: int, parts: int) -> tuple[int, int]:
    """``(lo, hi)``: the planned positions ``lo <= j < hi`` of part ``part`` of ``parts`` (``lo = part T // parts``).

    Raises:
        ValueError: ``parts < 1`` or ``part`` outside ``[0, parts)``.
    """
    if parts < 1 or not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts}")
    return part * num_frames // parts, (part + 1) * num_frames // parts


def plan_part(plan: DecodePlan, lo: int, hi: int) -> DecodePlan:
    """The plan of positions ``[lo, hi)``: its ``idx`` / ``times_s`` sliced, ``unique`` the frames they need."""
    idx = plan.idx[lo:hi]
    return DecodePlan(idx, sorted(set(idx)), plan.times_s[lo:hi], plan.sample_fps, plan.decode_hw)


def part_grids(grids: dict[tuple[int, int], tuple[list[int], int]], lo: int, hi: int
               ) -> dict[tuple[int, int], tuple[list[int], int]]:
    """The whole video's ``{grid: (positions, token cap)}`` restricted to ``[lo, hi)`` and shifted by ``-lo``;
    grids with no position there are left out."""
    out = {}
    for g, (pos, cap) in grids.items():
        mine = [j - lo for j in pos if lo <= j < hi]
        if mine:
            out[g] = (mine, cap)
    return out


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` along frames, into page-locked memory when every input was (the loader pinned the parts)."""
    tensors = [t for t in tensors if t.numel()] or tensors[:1]   # an empty part's tensor may not report pinned
    if len(tensors) == 1:
        return tensors[0]
    pinned = all(t.is_pinned() for t in tensors)
    shape = (sum(t.shape[0] for t in tensors), *tensors[0].shape[1:])
    out = torch.empty(shape, dtype=tensors[0].dtype, pin_memory=pinned)
    return torch.cat(tensors, out=out)


def join_frames(frames: list, lows: list[int], total: int):
    """The parts' frames as one video's: ``(T, H, W, 3)`` tensors concatenated, or :class:`EncoderFrames` merged per
    grid (positions shifted by each part's ``lo``), in part order.

    Raises:
        PartMismatch: the parts mix tensors and held frames, differ in frame size, or their counts do not add up to
            ``total``.
    """
    if all(isinstance(f, torch.Tensor) for f in frames):
        if len({tuple(f.shape[1:]) for f in frames if f.shape[0]}) > 1:
            raise PartMismatch(f"the parts' frames differ in size: {sorted({tuple(f.shape[1:]) for f in frames})}")
        out = _cat(list(frames))
        if out.shape[0] != total:
            raise PartMismatch(f"the parts hold {out.shape[0]} frames, the plan {total}")
        return out
    if not all(isinstance(f, EncoderFrames) for f in frames):
        raise PartMismatch("the parts mix frames held at the encoder's sizes and decode-size frames")
    if sum(len(f) for f in frames) != total or len({tuple(f.shape[1:]) for f in frames}) != 1:
        raise PartMismatch(f"the parts hold {sum(len(f) for f in frames)} frames, the plan {total}")
    grids = list(dict.fromkeys(g for f in frames for g in f.held))
    held = {}
    for g in grids:
        ts, pos = [], []
        for f, lo in zip(frames, lows):
            if g in f.held:
                t, p = f.held[g]
                ts.append(t)
                pos.extend(lo + j for j in p)
        held[g] = (_cat(ts), pos)
    return EncoderFrames((total, *frames[0].shape[1:]), held)


def join_info(infos: list[dict], lows: list[int]) -> dict:
    """The parts' ``video_info`` as the whole decode's: the plan's keys (:data:`PLAN_KEYS`, equal in every part),
    the position lists (:data:`POSITION_KEYS`) shifted and merged, the reader the parts used (where they differ, the
    first part's that did not use the first part's reader, with its ``decoder_fallback``), and
    ``concealment_checked: False`` when any part's frames went unchecked.

    Raises:
        PartMismatch: the parts' plan keys differ (a part re-planned on the decoder's timeline), or a part read on
            the CPU lists damaged frames (:data:`POSITION_KEYS`: where the decoder gives nothing for a sampled frame
            the whole decode repeats the last frame it gave, which may lie in the part before): decode it whole.
    """
    first = infos[0]
    for i, info in enumerate(infos[1:], 1):
        diff = [k for k in PLAN_KEYS if info.get(k) != first.get(k)]
        if diff:
            raise PartMismatch(f"part {i} planned other {', '.join(diff)} than part 0")
    for i, info in enumerate(infos):
        damaged = [k for k in POSITION_KEYS if info.get(k)]
        if damaged and info.get("decoder") != "nvdec":
            raise PartMismatch(f"part {i}, read by {info.get('decoder')}, lists {', '.join(damaged)}")
    out = {k: v for k, v in first.items() if k not in POSITION_KEYS and k not in ("decoder", "decoder_fallback",
                                                                                 "concealment_checked")}
    odd = next((info for info in infos if info.get("decoder") != first.get("decoder")), first)
    out["decoder"] = odd.get("decoder")
    if "decoder_fallback" in odd:
        out["decoder_fallback"] = odd["decoder_fallback"]
    for k in POSITION_KEYS:
        merged = sorted(lo + j for info, lo in zip(infos, lows) for j in info.get(k, ()))
        if merged:
            out[k] = merged
    if any(info.get("concealment_checked") is False for info in infos):
        out["concealment_checked"] = False
    # the keys in the order the whole decode sets them (records are JSON: the order shows in the file)
    rank = {k: i for i, k in enumerate(INFO_ORDER)}
    return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(rank))))
