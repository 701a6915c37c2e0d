"""Synthetic conversations + valid causal feature files for tests and the demo (no model, no media).

``python -m datamodules.synthetic_turns --out outputs/demo_turns`` writes, for sessions ``Session_1..Session_12``:

* ``<out>/features/Session_<n>.<mode>.safetensors`` for the three streaming modes (``datamodules.features`` format,
  meta ``memory_s=8.0, fps=2.0, output_hz=5.0, layer=-1, model="synthetic"``; masks and cost fields follow the
  DESIGN section 5 rules, e.g. 4 s -> 20 rows, replay prepares 22.0 media seconds);
* ``<out>/transcripts/Session_<n>.utterances.json``: the conversation (``start_s, end_s, participant_id, text,
  target_of_speech``), read by ``datamodules.turn_features.load_utterances_json``.

Features *carry future activity*: each row of the ``open-stream-replay`` file is a fixed random linear map of
[present voice activity, per-participant activity, VAP future bins of both channels and of every participant]
plus Gaussian noise, so a head can predict the future from row ``i`` alone. ``micro-chunk-200ms`` has weaker future
signal and more noise (independent 0.2 s payloads), ``completed-block-hold`` holds the replay state of the last
completed 2 s block (zeros + ``initialization_mask`` before the first one), so the three modes are distinguishable.
Fixed seeds: the same arguments give byte-identical tensors.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from algorithms.turn_targets import ROW_S, build_turn_targets
from datamodules.features import feature_path, save_features

MODES = ("open-stream-replay", "completed-block-hold", "micro-chunk-200ms")
BLOCK_ROWS = 10  # 2 s native block / 0.2 s rows


@dataclass
class SyntheticUtterance:
    """An utterance on the session timeline (seconds), same fields as ``datamodules.easycom.Utterance``."""

    start_s: float
    end_s: float
    participant_id: int
    text: str = ""
    target_of_speech: str = ""


def synth_conversation(duration_s: float, seed: int, participants: tuple[int, ...] = (1, 2, 3, 4),
                       hold_prob: float = 0.35, overlap_prob: float = 0.2) -> list[SyntheticUtterance]:
    """A random multi-party conversation: utterances 0.6-3.5 s, silences 0.15-1.2 s or overlaps up to 0.4 s."""
    rng = random.Random(seed)
    out, t, spk = [], rng.uniform(0.3, 1.0), rng.choice(participants)
    while True:
        dur = rng.uniform(0.6, 3.5)
        if t + dur > duration_s:
            break
        out.append(SyntheticUtterance(round(t, 3), round(t + dur, 3), spk, f"utt{len(out)}"))
        t = t + dur + (-rng.uniform(0.05, 0.4) if rng.random() < overlap_prob else rng.uniform(0.15, 1.2))
        if rng.random() >= hold_prob:
            spk = rng.choice([p for p in participants if p != spk])
    return out


def _oracle(utts: list[SyntheticUtterance], num_rows: int, participants: tuple[int, ...], wearer_id: int) -> torch.Tensor:
    # (T, Z): [va ch (2), future ch (8), per participant: va (1) + future (4)]
    tt = build_turn_targets(utts, num_rows, wearer_id=wearer_id)
    cols = [tt.va, tt.future.reshape(num_rows, -1)]
    for p in participants:
        tp = build_turn_targets(utts, num_rows, wearer_id=p)
        cols += [tp.va[:, :1], tp.future[:, 0]]
    return torch.cat(cols, dim=1)


def make_session_features(utts: list[SyntheticUtterance], num_rows: int, dim: int, seed: int, mode: str,
                          participants: tuple[int, ...] = (1, 2, 3, 4), wearer_id: int = 2,
                          noise: float = 0.5) -> dict[str, torch.Tensor]:
    """Feature tensors of one session in one mode (keys of ``datamodules.features.REQUIRED_TENSORS``).

    Returns:
        dict with ``states`` float32 (T, D) and the (T,) masks/times.
    Raises:
        ValueError: unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    z = _oracle(utts, num_rows, participants, wearer_id)  # (T, Z)
    proj = torch.randn(z.shape[1], dim, generator=torch.Generator().manual_seed(1234))  # shared by all sessions
    g = torch.Generator().manual_seed(seed)
    base = z @ proj + noise * torch.randn(num_rows, dim, generator=g)  # (T, D) replay states
    rows = torch.arange(num_rows)
    t = ROW_S * (rows + 1).float()
    boundary = (rows + 1) % BLOCK_ROWS == 0
    init = torch.zeros(num_rows, dtype=torch.bool)
    source = t.clone()
    if mode == "open-stream-replay":
        states, update, commit = base, torch.ones(num_rows, dtype=torch.bool), boundary
    elif mode == "micro-chunk-200ms":
        zm = z.clone()
        zm[:, 2:10] *= 0.5  # weaker anticipation from independent 0.2 s payloads
        states = zm @ proj + 2 * noise * torch.randn(num_rows, dim, generator=g)
        update = commit = torch.ones(num_rows, dtype=torch.bool)
    else:  # completed-block-hold: hold the state of the last completed block
        last = torch.where(boundary, rows, torch.full_like(rows, -1)).cummax(0).values  # (T,) last boundary row
        init = last < 0
        states = base[last.clamp(min=0)] * (~init)[:, None]
        source = torch.where(init, torch.full_like(t, -1.0), ROW_S * (last + 1).float())
        update = commit = boundary
    return {
        "states": states.float().contiguous(),
        "row_times": t,
        "initialization_mask": init.to(torch.uint8),
        "state_source_times": source,
        "state_update_mask": update.to(torch.uint8),
        "payload_commit_mask": commit.to(torch.uint8),
        "native_boundary_mask": boundary.to(torch.uint8),
    }


def _costs(mode: str, num_rows: int) -> tuple[int, float]:
    """(production_processor_calls, production_prepared_media_seconds) as in DESIGN section 5."""
    if mode == "open-stream-replay":
        return num_rows, round(sum(ROW_S * (i % BLOCK_ROWS + 1) for i in range(num_rows)), 6)
    if mode == "completed-block-hold":
        n = num_rows // BLOCK_ROWS
        return n, round(n * BLOCK_ROWS * ROW_S, 6)
    return num_rows, round(num_rows * ROW_S, 6)


def write_synthetic_dataset(out_dir: str | Path, num_sessions: int = 12, duration_s: float = 120.0, dim: int = 64,
                            seed: int = 0, modes: tuple[str, ...] = MODES, wearer_id: int = 2,
                            noise: float = 0.5, layer: int = -1) -> Path:
    """Write feature files (all modes) and utterance JSONs for ``Session_1..Session_<num_sessions>``.

    Returns:
        ``out_dir``; features in ``out_dir/features``, transcripts in ``out_dir/transcripts``.
    """
    out = Path(out_dir)
    (out / "transcripts").mkdir(parents=True, exist_ok=True)
    num_rows = int(round(duration_s / ROW_S))
    for n in range(1, num_sessions + 1):
        session = f"Session_{n}"
        utts = synth_conversation(duration_s, seed * 1000 + n)
        (out / "transcripts" / f"{session}.utterances.json").write_text(json.dumps([asdict(u) for u in utts]))
        for mode in modes:
            tensors = make_session_features(utts, num_rows, dim, seed * 1000 + n, mode, wearer_id=wearer_id, noise=noise)
            calls, media_s = _costs(mode, num_rows)
            meta = {"mode": mode, "audio_left_context": True, "memory_s": 8.0, "fps": 2.0, "output_hz": 5.0, "layer": layer, "model": "synthetic",
                    "session": session, "config_hash": f"synthetic-{seed}-{dim}", "production_processor_calls": calls,
                    "production_prepared_media_seconds": media_s, "wall_time_s": 0.0, "peak_memory_bytes": 0,
                    "verification": {"cache_replay": "synthetic", "micro_chunk_vs_continuous_semantics": "synthetic"}}
            save_features(feature_path(out / "features", session, mode), tensors, meta)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="outputs/demo_turns")
    p.add_argument("--num-sessions", type=int, default=12)
    p.add_argument("--duration-s", type=float, default=120.0)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.5)
    a = p.parse_args(argv)
    out = write_synthetic_dataset(a.out, a.num_sessions, a.duration_s, a.dim, a.seed, noise=a.noise)
    print(f"wrote {a.num_sessions} sessions x {len(MODES)} modes to {out}")


if __name__ == "__main__":
    main()
