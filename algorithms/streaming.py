"""The three causal streaming schedules of DESIGN §5: what each 5 Hz row prepares, commits and reads.

Pure (stdlib only): no torch, no transformers, no I/O. The model runner (``models/omni/thinker.py``) executes a schedule;
this module decides it and does the accounting, so the accounting can be checked without a model.

Time grid (all times are seconds since the start of one *stream*; a session may hold several streams, see
``datamodules/easycom.py``). Internally times are integer milliseconds so that no float rounding can move a row
across a block boundary.

* Output grid: right-edged 5 Hz, row ``i`` at ``t_i = 0.2 (i + 1)`` s, computed from media in ``[0, t_i]`` only.
* Video: 2 FPS right-edged frames; frame ``k`` shows ``[0.5 k, 0.5 (k + 1)]`` s and exists from ``0.5 (k + 1)`` s.
  Two frames form one temporal patch (1 s).
* Audio: 16 kHz; the thinker's audio tower yields 25 tokens per second (one per 40 ms).
* TMRoPE: 25 temporal positions per second; a native block is 2 s = 50 positions = 10 rows.

Modes (``MODES``):

``open-stream-replay``
    Completed native blocks stay in the KV cache. At every row the growing partial tail (0.2 … 2.0 s since the
    last block boundary) is prepared, prefilled temporarily, read, and dropped, unless it completes a block, in
    which case it is committed (kept). 4 s: 20 processor calls, 22.0 prepared media seconds.
``completed-block-hold``
    Only completed 2 s blocks are prepared (one call each) and committed; the other rows hold the last state. Rows
    before the first completed block hold zeros and are flagged in ``initialization_mask``.
``micro-chunk-200ms``
    Each new 0.2 s is one independent payload of 5 positions, committed at once. Refuses to run unless 10 micro
    steps tile one 50-position native block exactly (``check_micro_chunk_tiling``).

Memory (same rule in every mode): with ``M = memory_s / native_block_s`` blocks, a payload belonging to native
block ``b`` sees committed media of blocks ``>= max(0, b - (M - 1))`` only, so a state never sees more than
``memory_s`` seconds of media (plus the fixed prompt). How the runner enforces it is its memory policy
(``MEMORY_POLICIES``): ``window`` (default) evicts older blocks and re-prefills the kept ones, so that the cache
equals what a from-scratch prefill of that window gives (no information leaks from evicted blocks through deeper
layers' keys and values); ``sliding`` evicts older blocks' cache rows and keeps the kept blocks' keys and values as
computed (a sliding-window KV cache: deeper layers still carry information from evicted blocks). The schedule and
its accounting are the same under both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SettingError

OPEN_STREAM_REPLAY = "open-stream-replay"
COMPLETED_BLOCK_HOLD = "completed-block-hold"
MICRO_CHUNK_200MS = "micro-chunk-200ms"
MODES = (OPEN_STREAM_REPLAY, COMPLETED_BLOCK_HOLD, MICRO_CHUNK_200MS)
WINDOW = "window"
SLIDING = "sliding"
MEMORY_POLICIES = (WINDOW, SLIDING)
DEFAULT_MEMORY_POLICY = WINDOW  # also what a feature file without a ``memory_policy`` field was extracted with


def check_memory_policy(memory_policy: str, field: str = "memory_policy") -> str:
    """Return ``memory_policy`` if it is one of ``MEMORY_POLICIES``; raise ValueError naming ``field`` and listing
    them otherwise."""
    if memory_policy not in MEMORY_POLICIES:
        raise SettingError(f"unknown {field} {memory_policy!r}; expected one of {MEMORY_POLICIES}")
    return memory_policy


@dataclass(frozen=True)
class StreamGeometry:
    """Rates of the stream, in the model's units.

    Attributes:
        row_ms: output row spacing in ms (200 = 5 Hz).
        native_block_ms: native block length in ms (2000 = ``seconds_per_chunk`` of the thinker config).
        positions_per_s: TMRoPE temporal positions per second (``position_id_per_seconds``, 25).
        video_fps: sampled video frames per second (2).
        temporal_patch_size: frames per temporal patch of the vision tower (2).
        audio_tokens_per_s: audio-tower output tokens per second of 16 kHz audio (25).
        micro_ms: micro-chunk length in ms for ``micro-chunk-200ms`` (200).
    """

    row_ms: int = 200
    native_block_ms: int = 2000
    positions_per_s: int = 25
    video_fps: float = 2.0
    temporal_patch_size: int = 2
    audio_tokens_per_s: int = 25
    micro_ms: int = 200

    @property
    def rows_per_block(self) -> int:
        """Rows per native block (10). Raises ValueError when the block is not a whole number of rows."""
        if self.native_block_ms % self.row_ms:
            raise ValueError(f"native block {self.native_block_ms} ms is not a whole number of {self.row_ms} ms rows")
        return self.native_block_ms // self.row_ms

    @property
    def positions_per_block(self) -> float:
        """TMRoPE temporal positions in one native block (50)."""
        return self.positions_per_s * self.native_block_ms / 1000.0

    @property
    def frame_ms(self) -> float:
        """Spacing of sampled video frames in ms (500)."""
        return 1000.0 / self.video_fps

    @property
    def patch_s(self) -> float:
        """Seconds covered by one temporal patch (1.0): ``temporal_patch_size / video_fps``."""
        return self.temporal_patch_size / self.video_fps


DEFAULT_GEOMETRY = StreamGeometry()


def check_micro_chunk_tiling(geometry: StreamGeometry = DEFAULT_GEOMETRY, steps_per_block: int = 10) -> None:
    """Refuse micro-chunk streaming unless ``steps_per_block`` micro steps tile one native block exactly.

    Checks that ``steps_per_block * micro_ms == native_block_ms``, that each micro step spans a whole number of
    TMRoPE positions (``positions_per_s * micro_s``, 5 at 25/s) and of audio tokens, that these add up to the block's
    positions (50), and that a micro step is one output row.

    Raises:
        ValueError: naming the quantity that does not tile, e.g. ``position_id_per_seconds = 24`` gives 4.8 positions
            per 200 ms step.
    """
    g = geometry
    problems = []
    if steps_per_block * g.micro_ms != g.native_block_ms:
        problems.append(f"{steps_per_block} micro steps x {g.micro_ms} ms = {steps_per_block * g.micro_ms} ms, "
                        f"native block is {g.native_block_ms} ms")
    pos_step = g.positions_per_s * g.micro_ms / 1000.0
    if abs(pos_step - round(pos_step)) > 1e-9 or round(pos_step) < 1:
        problems.append(f"a {g.micro_ms} ms micro step spans {pos_step:g} TMRoPE positions at "
                        f"{g.positions_per_s}/s (not a whole number)")
    elif abs(steps_per_block * pos_step - g.positions_per_block) > 1e-9:
        problems.append(f"{steps_per_block} micro steps x {pos_step:g} positions = {steps_per_block * pos_step:g}, "
                        f"native block has {g.positions_per_block:g} positions")
    tok_step = g.audio_tokens_per_s * g.micro_ms / 1000.0
    if abs(tok_step - round(tok_step)) > 1e-9 or round(tok_step) < 1:
        problems.append(f"a {g.micro_ms} ms micro step holds {tok_step:g} audio tokens at "
                        f"{g.audio_tokens_per_s}/s (not a whole number)")
    if g.micro_ms != g.row_ms:
        problems.append(f"micro step {g.micro_ms} ms differs from the output row {g.row_ms} ms")
    if problems:
        raise SettingError("micro-chunk-200ms refuses to run: 10 micro steps must tile one 50-position native block "
                         "exactly; " + "; ".join(problems))


def num_rows(duration_s: float, geometry: StreamGeometry = DEFAULT_GEOMETRY) -> int:
    """Rows of the right-edged grid that fit in ``duration_s`` seconds of media: ``floor(duration / 0.2)``."""
    return int((round(duration_s * 1000.0, 6) + 1e-6) // geometry.row_ms)


def memory_blocks(memory_s: float, geometry: StreamGeometry = DEFAULT_GEOMETRY) -> int:
    """``memory_s`` as a whole number ``M >= 1`` of native blocks. Raises ValueError otherwise."""
    ms = round(memory_s * 1000.0)
    if ms <= 0 or ms % geometry.native_block_ms or abs(ms - memory_s * 1000.0) > 1e-6:
        raise SettingError(f"memory_s={memory_s} must be a positive multiple of the {geometry.native_block_ms / 1000:g} s "
                         "native block")
    return ms // geometry.native_block_ms


@dataclass(frozen=True)
class RowStep:
    """What one output row does. Times in ms since stream start.

    Attributes:
        row: row index ``i``.
        t_ms: right edge ``t_i`` (ms).
        block: native block index holding the row's newest media, ``(t_i - 1 ms) // block``.
        prepare_ms: ``(start, end)`` of the media prepared by a production processor call at this row, or ``None``.
        commit: the prepared payload is committed to the KV cache (kept for later rows).
        update: the state is (re)computed at this row (otherwise held from an earlier row, or zeros).
        boundary: a native block ends at ``t_i``.
        initialization: no state exists yet (row holds zeros).
        source_ms: end of the newest media the row's state saw (-1 if none).
        window_first_block: first native block of the media window the row's state attends to
            (``max(0, block - (M - 1))`` when the state was computed).
    """

    row: int
    t_ms: int
    block: int
    prepare_ms: tuple[int, int] | None
    commit: bool
    update: bool
    boundary: bool
    initialization: bool
    source_ms: int
    window_first_block: int

    @property
    def prepared_ms(self) -> int:
        """Length (ms) of media prepared at this row (0 if none)."""
        return 0 if self.prepare_ms is None else self.prepare_ms[1] - self.prepare_ms[0]


def schedule(mode: str, n_rows: int, memory_s: float = 8.0,
             geometry: StreamGeometry = DEFAULT_GEOMETRY) -> list[RowStep]:
    """The per-row plan of one stream of ``n_rows`` rows (``n_rows * 0.2`` s of media).

    Args:
        mode: one of ``MODES``.
        n_rows: number of 5 Hz rows (T_rows).
        memory_s: media memory in seconds, a multiple of the native block (default 8 s).
        geometry: stream rates.

    Returns:
        ``n_rows`` ``RowStep`` s in row order.

    Raises:
        ValueError: unknown mode; memory not a multiple of the block; micro-chunk tiling check failed.
    """
    if mode not in MODES:
        raise SettingError(f"unknown streaming mode {mode!r}; expected one of {MODES}")
    g = geometry
    if mode == MICRO_CHUNK_200MS:
        check_micro_chunk_tiling(g)
    rpb = g.rows_per_block
    m_blocks = memory_blocks(memory_s, g)
    steps: list[RowStep] = []
    last_source = -1
    last_window = 0
    for i in range(n_rows):
        t = (i + 1) * g.row_ms
        block = i // rpb
        block_start = block * g.native_block_ms
        boundary = (i + 1) % rpb == 0
        window = max(0, block - (m_blocks - 1))
        if mode == OPEN_STREAM_REPLAY:
            prep, commit, update = (block_start, t), boundary, True
        elif mode == MICRO_CHUNK_200MS:
            prep, commit, update = (t - g.row_ms, t), True, True
        else:  # completed-block-hold
            prep, commit, update = ((block_start, t), True, True) if boundary else (None, False, False)
        if update:
            last_source, last_window = t, window
        steps.append(RowStep(row=i, t_ms=t, block=block, prepare_ms=prep, commit=commit, update=update,
                             boundary=boundary, initialization=last_source < 0, source_ms=last_source,
                             window_first_block=last_window))
    return steps


@dataclass
class Accounting:
    """Cost and masks of a schedule (the DESIGN §5 table).

    Attributes:
        processor_calls: production processor calls (feature extractor + video processor on one payload = 1).
        prepared_media_s: seconds of media prepared by those calls.
        state_update_rows / payload_commit_rows / native_boundary_rows / initialization_rows: row indices.
        n_rows: T_rows.
    """

    n_rows: int
    processor_calls: int
    prepared_media_s: float
    state_update_rows: list[int] = field(default_factory=list)
    payload_commit_rows: list[int] = field(default_factory=list)
    native_boundary_rows: list[int] = field(default_factory=list)
    initialization_rows: list[int] = field(default_factory=list)


def accounting(steps: list[RowStep]) -> Accounting:
    """Count processor calls and prepared media seconds, and list the flagged rows of a schedule."""
    return Accounting(
        n_rows=len(steps),
        processor_calls=sum(s.prepare_ms is not None for s in steps),
        prepared_media_s=round(sum(s.prepared_ms for s in steps) / 1000.0, 6),
        state_update_rows=[s.row for s in steps if s.update],
        payload_commit_rows=[s.row for s in steps if s.commit],
        native_boundary_rows=[s.row for s in steps if s.boundary],
        initialization_rows=[s.row for s in steps if s.initialization],
    )


def masks(steps: list[RowStep]) -> dict[str, list]:
    """Per-row diagnostics as plain lists of length T_rows (the feature-file tensors except ``states``).

    Returns:
        ``row_times`` (s), ``initialization_mask``, ``state_source_times`` (s, -1 if none), ``state_update_mask``,
        ``payload_commit_mask``, ``native_boundary_mask`` (0/1 ints).
    """
    return {
        "row_times": [s.t_ms / 1000.0 for s in steps],
        "initialization_mask": [int(s.initialization) for s in steps],
        "state_source_times": [s.source_ms / 1000.0 if s.source_ms >= 0 else -1.0 for s in steps],
        "state_update_mask": [int(s.update) for s in steps],
        "payload_commit_mask": [int(s.commit) for s in steps],
        "native_boundary_mask": [int(s.boundary) for s in steps],
    }


def _rows_text(rows: list[int], n_rows: int) -> str:
    if n_rows and len(rows) == n_rows:
        return "every row"
    if not rows:
        return "none"
    if len(rows) > 8:
        return ", ".join(map(str, rows[:4])) + f", … ({len(rows)} rows)"
    return ", ".join(map(str, rows))


def format_accounting_table(table: dict[str, Accounting]) -> str:
    """A markdown table in the layout of DESIGN §5, one line per mode."""
    lines = ["| mode | processor calls | prepared media s | state-update rows | payload-commit rows | "
             "native boundaries |", "|---|---:|---:|---|---|---|"]
    for mode, a in table.items():
        lines.append(f"| {mode} | {a.processor_calls} | {a.prepared_media_s:.1f} | "
                     f"{_rows_text(a.state_update_rows, a.n_rows)} | {_rows_text(a.payload_commit_rows, a.n_rows)} | "
                     f"{_rows_text(a.native_boundary_rows, a.n_rows)} |")
    return "\n".join(lines)


def accounting_table(duration_s: float, memory_s: float = 8.0,
                     geometry: StreamGeometry = DEFAULT_GEOMETRY) -> dict[str, Accounting]:
    """``{mode: Accounting}`` for one stream of ``duration_s`` seconds in every mode."""
    n = num_rows(duration_s, geometry)
    return {m: accounting(schedule(m, n, memory_s, geometry)) for m in MODES}
