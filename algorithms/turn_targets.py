"""Turn-taking targets on the right-edged 5 Hz feature grid (pure: torch + stdlib, no I/O).

Grid: row ``i`` (0-based) sits at ``t_i = row_s * (i + 1)`` seconds (``row_s = 0.2``), the same grid as the cached
causal features (DESIGN section 5): row ``i``'s state saw media in ``[0, t_i]`` only, so the *present* frame of row
``i`` is the interval ``(t_i - row_s, t_i]`` and everything after ``t_i`` is the future.

Two channels: ``0`` = the glasses wearer (``wearer_id``, EasyCom ``Participant_ID``; configurable), ``1`` = all other
participants together (union of their speech). Speech comes from utterances with ``start_s``/``end_s`` on the session
timeline (any object with ``start_s, end_s, participant_id``, e.g. ``datamodules.easycom.Utterance``).

Definitions (all coverage is exact interval arithmetic on the merged speech of a channel, no sampling):

* **Voice activity** ``va[i, c] = 1`` iff channel ``c`` speaks during at least ``active_ratio`` (0.5) of the present
  frame ``(t_i - 0.2, t_i]``.
* **Future activity (VAP projection window)** following Ekstedt & Skantze, "Voice Activity Projection:
  Self-supervised Learning of Turn-taking Events", Interspeech 2022 (github.com/ErikEkstedt/VoiceActivityProjection):
  a 2 s window after ``t_i`` cut into 4 bins of 0.2, 0.4, 0.6, 0.8 s, i.e. ``(t_i + a_k, t_i + b_k]`` with
  ``(a_k, b_k)`` = (0, 0.2), (0.2, 0.6), (0.6, 1.2), (1.2, 2.0); ``future[i, c, k] = 1`` iff channel ``c`` is active
  for at least ``active_ratio`` of bin ``k`` (VAP's bin threshold 0.5). We keep the 8 bins as independent binary
  targets (VAP's "independent" objective) rather than VAP's 256-class joint state. ``future_valid[i]`` is false when
  the 2 s window runs past the end of the session (``num_rows * row_s``); those rows carry no future targets.
* **Shift / hold events** (participant level, in the spirit of VAP's event extraction): a *mutual silence* is a
  maximal interval ``[s0, s1)`` in which no participant speaks, with ``s1 - s0 >= min_silence_s``, that starts after
  speech and ends with speech inside the session. It is an event when exactly one participant (the *previous
  speaker*) speaks in ``[s0 - pre_cond_s, s0)`` and exactly one participant (the *next speaker*) speaks in
  ``[s1, s1 + post_cond_s)`` (VAP's 1 s pre/post conditions by default). ``hold`` if next == previous, else
  ``shift``. The event is labelled at one row: the first row with ``t_i >= s0 + pad_s`` (the model has heard
  ``pad_s`` of silence) and ``t_i < s1`` (the next speaker has not started yet); no such row, no event. A change
  between two non-wearers counts as a shift although both sit in the "others" channel.

Errors: ``ValueError`` for a non-positive ``num_rows``/``row_s`` or an utterance with ``end_s < start_s``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

ROW_S = 0.2
FUTURE_BINS_S: tuple[tuple[float, float], ...] = ((0.0, 0.2), (0.2, 0.6), (0.6, 1.2), (1.2, 2.0))
CHANNELS = ("wearer", "others")
EPS = 1e-9


def target_names() -> list[str]:
    """Names of the 10 binary per-row targets, in the column order of :func:`flat_targets`.

    ``va_wearer, va_others, f0_wearer..f3_wearer, f0_others..f3_others`` (``fk`` = future bin k).
    """
    names = [f"va_{c}" for c in CHANNELS]
    names += [f"f{k}_{c}" for c in CHANNELS for k in range(len(FUTURE_BINS_S))]
    return names


NUM_TARGETS = len(target_names())


@dataclass
class TurnEvent:
    """One shift/hold event: silence ``[silence_start_s, silence_end_s)``, labelled at ``row``."""

    row: int
    silence_start_s: float
    silence_end_s: float
    prev_speaker: int
    next_speaker: int
    shift: bool


@dataclass
class TurnTargets:
    """Targets of one session on the 5 Hz grid (T = ``num_rows``).

    Attributes:
        va: float (T, 2) voice activity of [wearer, others] in the present frame, 0/1.
        future: float (T, 2, 4) future activity per channel and VAP bin, 0/1 (0 where ``future_valid`` is false).
        future_valid: bool (T,) the whole 2 s projection window lies inside the session.
        event_mask: bool (T,) a shift/hold event is labelled at this row.
        shift: long (T,) 1 shift, 0 hold, -1 no event.
        next_speaker: long (T,) Participant_ID of the next speaker at event rows, -1 elsewhere.
        events: the events, in time order.
    """

    va: torch.Tensor
    future: torch.Tensor
    future_valid: torch.Tensor
    event_mask: torch.Tensor
    shift: torch.Tensor
    next_speaker: torch.Tensor
    events: list[TurnEvent] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return int(self.va.shape[0])


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of ``[start, end)`` intervals (seconds) as sorted, disjoint, non-touching intervals."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1] + EPS:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def coverage(merged: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of ``[a, b)`` covered by the merged intervals ``merged``."""
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in merged if e > a and s < b)


def _channel_speech(utterances: Sequence[Any], wearer_id: int, duration_s: float) -> list[list[tuple[float, float]]]:
    wearer, others = [], []
    for u in utterances:
        s, e = float(u.start_s), float(u.end_s)
        if e < s:
            raise ValueError(f"utterance ends before it starts: {u!r}")
        s, e = max(0.0, s), min(duration_s, e)
        (wearer if int(u.participant_id) == wearer_id else others).append((s, e))
    return [merge_intervals(wearer), merge_intervals(others)]


def _activity(merged: Sequence[tuple[float, float]], starts: torch.Tensor, width_s: float, ratio: float) -> torch.Tensor:
    # starts (T,) float64 seconds -> (T,) 0/1: covered >= ratio * width over [start, start + width)
    cov = torch.zeros_like(starts)
    for s, e in merged:
        cov += (torch.minimum(starts + width_s, torch.tensor(e, dtype=starts.dtype))
                - torch.maximum(starts, torch.tensor(s, dtype=starts.dtype))).clamp(min=0)
    return (cov >= ratio * width_s - EPS).to(torch.float32)


def shift_hold_events(utterances: Sequence[Any], num_rows: int, row_s: float = ROW_S, min_silence_s: float = 0.2,
                      pre_cond_s: float = 1.0, post_cond_s: float = 1.0, pad_s: float = 0.05) -> list[TurnEvent]:
    """Shift/hold events at mutual silences (definition in the module docstring), participant level.

    Args:
        utterances: objects with ``start_s, end_s`` (seconds) and ``participant_id``.
        num_rows: T, number of 5 Hz rows of the session (session length ``T * row_s`` s).
    Returns:
        events in time order; ``event.row`` in ``[0, T)``.
    """
    duration_s = num_rows * row_s
    per_spk: dict[int, list[tuple[float, float]]] = {}
    for u in utterances:
        per_spk.setdefault(int(u.participant_id), []).append((max(0.0, float(u.start_s)), min(duration_s, float(u.end_s))))
    per_spk = {p: merge_intervals(v) for p, v in per_spk.items()}
    everyone = merge_intervals(iv for v in per_spk.values() for iv in v)
    events = []
    for (_, s0), (s1, _) in zip(everyone[:-1], everyone[1:]):
        if s1 - s0 < min_silence_s - EPS:
            continue
        pre = [p for p, v in per_spk.items() if coverage(v, s0 - pre_cond_s, s0) > EPS]
        post = [p for p, v in per_spk.items() if coverage(v, s1, s1 + post_cond_s) > EPS]
        if len(pre) != 1 or len(post) != 1 or s0 - pre_cond_s < -EPS or s1 + post_cond_s > duration_s + EPS:
            continue
        row = max(0, math.ceil((s0 + pad_s) / row_s - 1 - 1e-6))  # first i with 0.2 (i + 1) >= s0 + pad
        if row >= num_rows or row_s * (row + 1) >= s1 - EPS:
            continue
        events.append(TurnEvent(row, s0, s1, pre[0], post[0], pre[0] != post[0]))
    return events


def build_turn_targets(utterances: Sequence[Any], num_rows: int, wearer_id: int = 2, row_s: float = ROW_S,
                       active_ratio: float = 0.5, min_silence_s: float = 0.2, pre_cond_s: float = 1.0,
                       post_cond_s: float = 1.0, pad_s: float = 0.05) -> TurnTargets:
    """All targets of one session on the right-edged grid (definitions in the module docstring).

    Args:
        utterances: objects with ``start_s, end_s`` (session seconds) and ``participant_id``; speech beyond
            ``num_rows * row_s`` is clipped.
        num_rows: T, rows of the session's feature file.
        wearer_id: Participant_ID of the glasses wearer (channel 0).
    Returns:
        :class:`TurnTargets` with tensors of T rows.
    Raises:
        ValueError: ``num_rows <= 0``, ``row_s <= 0`` or an utterance with ``end_s < start_s``.
    """
    if num_rows <= 0 or row_s <= 0:
        raise ValueError(f"num_rows ({num_rows}) and row_s ({row_s}) must be positive")
    duration_s = num_rows * row_s
    speech = _channel_speech(utterances, wearer_id, duration_s)
    t = row_s * (torch.arange(num_rows, dtype=torch.float64) + 1)  # (T,) right edges t_i
    va = torch.stack([_activity(m, t - row_s, row_s, active_ratio) for m in speech], dim=1)  # (T, 2)
    future = torch.stack([
        torch.stack([_activity(m, t + a, b - a, active_ratio) for a, b in FUTURE_BINS_S], dim=1) for m in speech
    ], dim=1)  # (T, 2, 4)
    future_valid = t + FUTURE_BINS_S[-1][1] <= duration_s + EPS  # (T,)
    future = future * future_valid[:, None, None]
    events = shift_hold_events(utterances, num_rows, row_s, min_silence_s, pre_cond_s, post_cond_s, pad_s)
    event_mask = torch.zeros(num_rows, dtype=torch.bool)
    shift = torch.full((num_rows,), -1, dtype=torch.long)
    next_speaker = torch.full((num_rows,), -1, dtype=torch.long)
    for ev in events:
        event_mask[ev.row] = True
        shift[ev.row] = int(ev.shift)
        next_speaker[ev.row] = ev.next_speaker
    return TurnTargets(va, future, future_valid, event_mask, shift, next_speaker, events)


def flat_targets(tt: TurnTargets, row_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row binary targets in :func:`target_names` order and their validity mask.

    Args:
        tt: a session's targets (T rows).
        row_valid: optional bool (T,) rows to use at all (e.g. False on initialization rows).
    Returns:
        ``(targets, mask)``: float (T, 10) 0/1 and bool (T, 10); future columns are masked where the projection
        window leaves the session.
    """
    T = tt.num_rows
    targets = torch.cat([tt.va, tt.future.reshape(T, -1)], dim=1)  # (T, 2 + 8)
    mask = torch.ones(T, NUM_TARGETS, dtype=torch.bool)
    mask[:, 2:] = tt.future_valid[:, None]
    if row_valid is not None:
        mask &= row_valid[:, None]
    return targets, mask
