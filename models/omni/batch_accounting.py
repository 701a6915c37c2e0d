"""What the lockstep batch runner reports: its result type, the measured-cost fields (``COMPUTED_FIELDS``) with the
one-session path's figures for comparison, and the profile's parts (``BREAKDOWN_PARTS``, timed by ``PartTimer``).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from .thinker_media import frame_indices
from .thinker_stream import StreamResult

COMPUTED_FIELDS = {
    "computed_processor_calls": "feature-extractor calls + video-processor calls actually run for the stream "
                                "(per row: one of each at most; the one-session path counts the same way)",
    "computed_audio_seconds": "seconds of audio featurised (log-mel) and encoded by the audio tower",
    "computed_video_seconds": "seconds of video encoded by the vision tower (0.5 s per real frame of a patch)",
    "computed_encoder_seconds_of_media": "computed_audio_seconds + computed_video_seconds",
    "computed_vision_patches": "temporal patches through the vision tower",
    "computed_llm_tokens": "tokens prefilled through the LLM (payloads + window re-prefills under the window "
                           "policy, payloads only under sliding; prompt excluded)",
    "computed_reprefill_calls": "LLM calls that re-prefilled the stream's kept blocks at window slides (window "
                                "policy; one call serves every stream of the batch, and with reprefill_slides > 1 "
                                "several slides; 0 under sliding)",
}
BREAKDOWN_PARTS = {  # BatchedOmniRunner(profile=True).breakdown: wall seconds of one run_streams call per part
    "prep_audio": "the block's audio to the device + log-mel (LogMel) of every stream's payload audio",
    "prep_video": "the block's frames to the device + the video processor on every new temporal patch",
    "vision_tower": "vision tower (get_video_features) on the new temporal patches",
    "audio_tower": "audio tower on every stream's payload log-mel",
    "llm": "the batched LLM prefill of the row's payloads (state read-out included)",
    "llm_reprefill": "window policy: re-prefill of the kept blocks when the memory window slides",
    "cache": "KV cache edits: eviction (sliding), cut back (window, temporary tails), finished streams dropped",
    "other": "the rest of the wall time: Python bookkeeping, payload assembly, positions, state copies to the host",
}


@dataclass
class BatchedStreamResult(StreamResult):
    """``StreamResult`` plus the measured cost of the batched path.

    Attributes:
        computed: ``COMPUTED_FIELDS`` -> value, for this stream.
        batch_size: streams in the lockstep group at its start.
        batch_wall_time_s: wall time of the whole group (``wall_time_s`` is this divided by ``batch_size``).
        group: index of that lockstep group within its ``run_streams`` call (-1: the stream ran in none).
    """

    computed: dict[str, float] = field(default_factory=dict)
    batch_size: int = 1
    batch_wall_time_s: float = 0.0
    group: int = -1


def single_session_computed(steps, n_frames: int, geometry=None) -> dict[str, float]:
    """What the one-session path (``run_stream``) computes for ``steps`` (no reuse): same ``COMPUTED_FIELDS``."""
    from algorithms.streaming import DEFAULT_GEOMETRY

    g = geometry or DEFAULT_GEOMETRY
    out = dict.fromkeys(COMPUTED_FIELDS, 0.0)
    for s in steps:
        if s.prepare_ms is None:
            continue
        a, z = s.prepare_ms
        f = len([k for k in frame_indices(a, z, g.frame_ms) if k < n_frames])
        out["computed_processor_calls"] += 1 + (1 if f else 0)
        out["computed_audio_seconds"] += (z - a) / 1000.0
        out["computed_video_seconds"] += f * g.frame_ms / 1000.0
        out["computed_vision_patches"] += -(-f // g.temporal_patch_size)
    out["computed_encoder_seconds_of_media"] = out["computed_audio_seconds"] + out["computed_video_seconds"]
    return {k: round(v, 6) for k, v in out.items()}


class _Part:
    """Times one part of the row loop into ``breakdown[name]``, synchronizing the device around it."""

    def __init__(self, owner: "BatchedOmniRunner", name: str):
        self.owner, self.name = owner, name

    def __enter__(self):
        self.owner._sync()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.owner._sync()
        self.owner.breakdown[self.name] += time.perf_counter() - self.t0


_NO_PART = nullcontext()


class PartTimer:
    """``profile=True`` timing of the row loop's parts into ``breakdown`` (``BREAKDOWN_PARTS``); uses the owner's
    ``runner.device``, ``profile`` and ``breakdown``."""

    def _sync(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)

    def _part(self, name: str):
        return _Part(self, name) if self.profile else _NO_PART
