"""``OmniFeatureExtractor``: thin LightningModule around ``models.omni.thinker.OmniThinkerRunner`` (DESIGN §5).

One ``predict_step`` = one session (a batch from ``datamodules.easycom.EasyComStreamDataModule``): each stream of
the session is run in the configured mode and its rows are placed on the session's 5 Hz grid; rows no stream
covers are initialization rows. The returned record is what ``callbacks.feature_writer.FeatureWriter`` saves
(``datamodules.features`` format).

Batched path (issue 12): with ``sessions_per_batch = N > 1`` a predict batch that is a list of sessions runs all
their streams in lockstep groups of at most N (``extract_sessions`` / ``models.omni.batch``) and returns a list of
records; ``EasyComStreamDataModule(sessions_per_batch=N)`` hands over such lists and ``FeatureWriter`` writes every
record of one; a single-session batch always takes the one-session path.
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from algorithms.streaming import (DEFAULT_MEMORY_POLICY, MICRO_CHUNK_200MS, MODES, SLIDING, accounting,
                                  check_memory_policy, masks, num_rows)
from algorithms.errors import SettingError, check_dtype, check_int
from datamodules.features import nonfinite_rows
from models.omni import COMPUTED_FIELDS, BatchedOmniRunner, OmniThinkerRunner

log = logging.getLogger(__name__)


def _fatal(e: BaseException) -> bool:
    """Errors a failed-session record must not hide, because every later session would fail the same way: a
    setting error, and a CUDA error that leaves the context unusable (illegal access, device-side assert)."""
    if isinstance(e, (SettingError, ImportError, MemoryError)) or type(e).__name__ == "AcceleratorError":
        return True
    return isinstance(e, RuntimeError) and not isinstance(e, torch.OutOfMemoryError) and "CUDA error" in str(e)


def _attempt(fn):
    """``(fn(), None)``, or ``(None, "Type: message")`` when it raises a non-fatal error (:func:`_fatal` ones are
    raised). After a failure the handler is left first (its traceback, which holds the failed call's tensors, is
    dropped), then the collector and the CUDA cache give that memory back, so what runs next has it."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on (unless the run itself cannot go on)
        if _fatal(e):
            raise
        failure = f"{type(e).__name__}: {e}"
    gc.collect()
    torch.cuda.empty_cache()   # (a no-op without an initialised CUDA context)
    return None, failure

OUTPUT_HZ = 5.0
VIDEO_FPS = 2.0


def config_hash(settings: dict[str, Any]) -> str:
    """Short sha256 of the JSON-serialised extraction settings (sorted keys)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def extract_session(runner: OmniThinkerRunner, session: dict[str, Any], mode: str, memory_s: float,
                    verify_rows: int = 4, extra_meta: dict[str, Any] | None = None,
                    memory_policy: str = DEFAULT_MEMORY_POLICY) -> dict[str, Any]:
    """Run every stream of one session and assemble the feature-file record.

    Args:
        runner: the thinker runner.
        session: ``{"session", "timeline_end_s", "streams": [{"start_s", "frames" (F, H, W, 3) uint8,
            "audio" (S,) float32 16 kHz, ...}]}``; stream starts are multiples of 0.2 s.
        mode, memory_s, verify_rows, memory_policy: see ``OmniThinkerRunner.run_stream``.

    Returns:
        ``{"session", "mode", "tensors": {states (T_rows, D) and the masks of datamodules.features},
        "meta": {...}}`` with T_rows = ``floor(timeline_end_s / 0.2)``.
    """
    check_memory_policy(memory_policy)
    results = [runner.run_stream(st["frames"].cpu().numpy(), st["audio"].cpu().numpy(), mode, memory_s, rows,
                                 verify_rows, memory_policy=memory_policy) if rows > 0 else None
               for st, rows in _stream_rows(runner, session)]
    return _assemble(runner, session, mode, memory_s, results, extra_meta, memory_policy)


def extract_sessions(runner: OmniThinkerRunner, sessions: list[dict[str, Any]], mode: str, memory_s: float,
                     verify_rows: int = 4, sessions_per_batch: int = 8, batched: BatchedOmniRunner | None = None,
                     extra_meta: dict[str, Any] | None = None,
                     memory_policy: str = DEFAULT_MEMORY_POLICY) -> list[dict[str, Any]]:
    """``extract_session`` for several sessions at once, their streams run in lockstep groups of at most
    ``sessions_per_batch`` by ``models.omni.batch.BatchedOmniRunner`` (states, masks, production accounting and
    verification as the one-session path; ``meta`` adds the ``computed_*`` figures, ``sessions_per_batch``,
    ``batch_wall_time_s``, and ``wall_time_s`` becomes the session's share of its groups' wall time)."""
    check_memory_policy(memory_policy)
    batched = batched or BatchedOmniRunner(runner, sessions_per_batch)
    flat, owners = [], []
    for si, session in enumerate(sessions):
        for k, (st, rows) in enumerate(_stream_rows(runner, session)):
            if rows > 0:
                flat.append({"frames": st["frames"].cpu().numpy(), "audio": st["audio"].cpu().numpy(),
                             "n_rows": rows})
                owners.append((si, k))
    res = batched.run_streams(flat, mode, memory_s, verify_rows, memory_policy=memory_policy)
    per: list[list] = [[None] * len(s["streams"]) for s in sessions]
    for (si, k), r in zip(owners, res):
        per[si][k] = r
    out = []
    for session, results in zip(sessions, per):
        got = [r for r in results if r is not None]
        meta = {"sessions_per_batch": batched.sessions_per_batch,
                "batch_wall_time_s": sum({r.group: r.batch_wall_time_s for r in got if r.group >= 0}.values())}
        if mode == MICRO_CHUNK_200MS:  # the only mode whose rows it batches
            meta["batch_rows"] = batched.batch_rows
        if memory_policy != SLIDING and getattr(batched, "fuse_slide_rows", False):  # recorded when on only
            meta["fuse_slide_rows"] = True
        for key in COMPUTED_FIELDS:
            meta[key] = round(sum(r.computed[key] for r in got), 6)
        out.append(_assemble(runner, session, mode, memory_s, results, {**meta, **(extra_meta or {})},
                             memory_policy))
    return out


def _stream_rows(runner: OmniThinkerRunner, session: dict[str, Any]):
    """``(stream, rows)`` per stream: rows of the stream on the session grid (<= 0: nothing to run)."""
    g = runner.geometry
    n = num_rows(float(session["timeline_end_s"]), g)
    for st in session["streams"]:
        r0 = int(round(float(st["start_s"]) * 1000)) // g.row_ms
        yield st, min(num_rows(len(st["audio"]) / 16000.0, g), n - r0)


def _assemble(runner: OmniThinkerRunner, session: dict[str, Any], mode: str, memory_s: float, results: list,
              extra_meta: dict[str, Any] | None, memory_policy: str = DEFAULT_MEMORY_POLICY) -> dict[str, Any]:
    """The feature-file record of one session from its streams' ``StreamResult`` s (None: stream not run)."""
    g = runner.geometry
    n = num_rows(float(session["timeline_end_s"]), g)
    d = runner.hidden_size
    tensors = {"states": torch.zeros(n, d, dtype=torch.float32),
               "row_times": torch.tensor([(i + 1) * g.row_ms / 1000.0 for i in range(n)], dtype=torch.float32),
               "initialization_mask": torch.ones(n, dtype=torch.uint8),
               "state_source_times": torch.full((n,), -1.0, dtype=torch.float32),
               "state_update_mask": torch.zeros(n, dtype=torch.uint8),
               "payload_commit_mask": torch.zeros(n, dtype=torch.uint8),
               "native_boundary_mask": torch.zeros(n, dtype=torch.uint8)}
    calls, prepared, wall, peak = 0, 0.0, 0.0, 0
    streams_meta, verifications = [], []
    for k, (st, res) in enumerate(zip(session["streams"], results)):
        if res is None:
            continue
        r0 = int(round(float(st["start_s"]) * 1000)) // g.row_ms
        rows = res.states.shape[0]
        m = masks(res.steps)
        sl = slice(r0, r0 + rows)
        tensors["states"][sl] = res.states
        for key in ("initialization_mask", "state_update_mask", "payload_commit_mask", "native_boundary_mask"):
            tensors[key][sl] = torch.tensor(m[key], dtype=torch.uint8)
        src = torch.tensor(m["state_source_times"], dtype=torch.float32)
        tensors["state_source_times"][sl] = torch.where(src >= 0, src + float(st["start_s"]), src)
        calls += res.processor_calls
        prepared += res.prepared_media_s
        wall += res.wall_time_s
        peak = max(peak, res.peak_memory_bytes)
        acc = accounting(res.steps)
        streams_meta.append({"stream": k, "start_s": float(st["start_s"]), "first_row": r0, "rows": rows,
                             "processor_calls": acc.processor_calls, "prepared_media_s": acc.prepared_media_s})
        verifications.append({"stream": k, **res.verification})
    cache_ok = all(v["cache_replay"]["passed"] for v in verifications)
    checked = sum(len(v["cache_replay"]["rows"]) for v in verifications)
    worst = max((v["cache_replay"]["max_abs_diff"] for v in verifications), default=0.0)
    micro = [v["micro_chunk_vs_continuous_semantics"] for v in verifications]
    cos = [c for mc in micro if mc.get("applicable") for c in mc["cosine"]]
    settings = {"mode": mode, "memory_s": float(memory_s), "fps": VIDEO_FPS, "output_hz": OUTPUT_HZ,
                "layer": runner.layer, "model": runner.model_dir, "dtype": str(runner.dtype),
                "prompt_token_ids": runner.prompt_token_ids}
    if memory_policy != DEFAULT_MEMORY_POLICY:  # window files keep the hash they had before the field existed
        settings["memory_policy"] = memory_policy
    settings["audio_left_context"] = bool(getattr(runner, "audio_left_context", True))
    meta = {"mode": mode, "memory_s": float(memory_s), "memory_policy": memory_policy, "fps": VIDEO_FPS,
            "output_hz": OUTPUT_HZ,
            "layer": runner.layer, "num_layers": int(runner.text_config.num_hidden_layers),
            "model": Path(runner.model_dir).name, "model_path": runner.model_dir,
            "session": session["session"], "config_hash": config_hash(settings),
            "audio_left_context": settings["audio_left_context"],
            "production_processor_calls": calls, "production_prepared_media_seconds": round(prepared, 6),
            "wall_time_s": wall, "peak_memory_bytes": int(peak),
            # CUDA: the peak allocated during this session's streams; CPU: the process's peak RSS so far (it
            # includes the model and earlier sessions, so it never falls)
            "peak_memory_kind": "cuda_max_allocated" if runner.device.type == "cuda" else "process_max_rss",
            "hidden_size": d, "num_rows": n,
            "prompt_source": runner.prompt_source, "num_prompt_tokens": len(runner.prompt_token_ids),
            "gap_policy": session.get("gap_policy"), "streams": streams_meta,
            "verification": {
                "cache_replay": {"passed": cache_ok, "checked_rows": checked, "max_abs_diff": worst,
                                 "per_stream": verifications},
                "micro_chunk_vs_continuous_semantics": {
                    "applicable": bool(cos), "mean_cosine": (sum(cos) / len(cos)) if cos else None,
                    "note": "diagnostic, not an equivalence"}}}
    if extra_meta:
        meta.update(extra_meta)
    return {"session": session["session"], "mode": mode, "tensors": tensors, "meta": meta}


class OmniFeatureExtractor(LightningModule):
    """Causal 5 Hz Qwen2.5-Omni thinker features in one streaming mode.

    Args:
        model_dir: local thinker directory (``python -m models.omni.tiny <dir>`` writes a tiny random one).
        mode: ``open-stream-replay`` | ``completed-block-hold`` | ``micro-chunk-200ms``.
        memory_s: media memory in seconds (multiple of 2; default 8).
        memory_policy: ``window`` (default: exact finite memory, kept blocks re-prefilled on every slide) or
            ``sliding`` (sliding-window KV cache, absolute positions; ``models/omni/thinker.py`` docstring). Recorded in
            every file's meta; training fails closed on a mismatch.
        layer: hidden-state index read out (see ``OmniThinkerRunner``; -1 = final).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: ``sdpa`` | ``eager``.
        verify_rows: rows per stream re-checked from scratch (``cache_replay``); -1 all, 0 none.
        prompt_token_ids: fixed prompt override.
        sessions_per_batch: 1 (default) runs one stream at a time (``extract_session``); N > 1 runs the streams
            of a batch that is a *list* of sessions in lockstep groups of at most N (``extract_sessions``,
            ``models.omni.batch``: same states, adds ``computed_*`` to the meta). A single-session batch is
            always run the one-session way.
        compile_small_calls: ``torch.compile`` the audio tower and the LLM in the batched path (default off).
        batch_rows: batched path, ``micro-chunk-200ms``: a native block's 10 rows as one call per tower and one
            causal LLM prefill (default on; states equal to fp32 rounding, ``models.omni.batch``); False: one call
            per row, as a live stream runs (bit-identical to the one-session path). Recorded in the meta.
        flash_prefill: batched path on CUDA: LLM prefills on top of the cache with SDPA's lower-right causal bias
            (flash kernel) instead of the library's explicit mask (``models.omni.attention.lower_right_causal_sdpa``).
        reprefill_slides: batched path, ``window`` policy: the re-prefills of up to this many window slides run as one
            LLM call (``models.omni.batch``; states equal to fp32 rounding, 1: one call per slide, bit-identical);
            null (default): as many as fit the runner's memory bound. The meta's ``computed_reprefill_calls`` counts
            the calls.
        fuse_slide_rows: batched path, ``window`` policy: the slide row's own payloads are prefilled in the
            re-prefill call of its slide (one LLM call fewer per slide, the same tokens; states equal to fp32
            rounding, ``models.omni.batch_reprefill``). Off by default.
        audio_left_context: a payload's log-mel takes the 200 samples before it as left STFT padding (causal), so
            its first frames equal the whole-clip log-mel (``models.omni.thinker.OmniThinkerRunner``); ``False``: the
            payload's own reflect padding (the earlier features).
    """

    def __init__(self, model_dir: str, mode: str = "open-stream-replay", memory_s: float = 8.0, layer: int = -1,
                 dtype: str = "float32", attn_implementation: str = "sdpa", verify_rows: int = 4,
                 prompt_token_ids: list[int] | None = None, sessions_per_batch: int = 1,
                 compile_small_calls: bool = False, memory_policy: str = DEFAULT_MEMORY_POLICY,
                 batch_rows: bool = True, flash_prefill: bool = True, audio_left_context: bool = True,
                 reprefill_slides: int | None = None, fuse_slide_rows: bool = False):
        super().__init__()
        if mode not in MODES:   # before the model loads
            raise SettingError(f"unknown streaming mode {mode!r}; expected one of {MODES}")
        check_memory_policy(memory_policy)
        check_dtype("model.init_args.dtype", dtype)
        check_int("model.init_args.sessions_per_batch", sessions_per_batch, 1)
        check_int("model.init_args.reprefill_slides", reprefill_slides, 1, allow_none=True,
                  none_means="as many slides as fit the memory bound")
        self.save_hyperparameters()
        self._warned_single = self._warned_list = False   # data/model sessions_per_batch mismatches, warned once
        self.runner = OmniThinkerRunner(model_dir, layer=layer, prompt_token_ids=prompt_token_ids, dtype=dtype,
                                        attn_implementation=attn_implementation, audio_left_context=audio_left_context)
        # refused here, before any session is decoded, not as one failure per session
        self.runner.check_settings(mode, memory_s, memory_policy, verify_rows)
        self.batched = (BatchedOmniRunner(self.runner, sessions_per_batch, compile_small_calls=compile_small_calls,
                                          batch_rows=batch_rows, flash_prefill=flash_prefill,
                                          reprefill_slides=reprefill_slides, fuse_slide_rows=fuse_slide_rows)
                        if sessions_per_batch > 1 else None)
        if mode != MICRO_CHUNK_200MS and not batch_rows:
            rank_zero_warn(f"batch_rows=False has no effect in {mode} (only micro-chunk-200ms rows are batched)")
        elif mode == MICRO_CHUNK_200MS and batch_rows and sessions_per_batch == 1:
            rank_zero_info("micro-chunk-200ms with sessions_per_batch=1 runs one call per row; the batched path "
                           "(sessions_per_batch > 1 on the model and the data) also batches a block's rows")

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # media stay on the host; payloads go to the device after preparation

    def predict_step(self, batch: dict[str, Any] | list[dict[str, Any]], batch_idx: int = 0):
        """One session (dict) -> its record; a list of sessions -> their records (batched when
        ``sessions_per_batch > 1``).

        A session that failed to decode (``{"session", "error"}``) or whose extraction raises becomes an error
        record ``{"session", "mode", "error", "meta"}`` (``FeatureWriter`` writes it beside the features and the run
        goes on); when a lockstep group raises, its sessions are retried one at a time, so one bad session does not
        cost the others."""
        hp = self.hparams
        if isinstance(batch, dict):
            if self.batched is not None and not self._warned_single:
                self._warned_single = True
                rank_zero_warn(f"sessions_per_batch={hp.sessions_per_batch} on the model, but the datamodule hands "
                               "over one session at a time: it runs the one-session path (set data.init_args."
                               "sessions_per_batch too)")
            return self._one(batch)
        records: list[dict[str, Any] | None] = [self._error(s["session"], s["error"]) if "error" in s else None
                                                for s in batch]
        todo = [s for s, r in zip(batch, records) if r is None]
        if todo:
            done, failure = _attempt(lambda: self._many(todo))
            if failure is not None:   # one session's failure must not cost the others: retry them alone
                log.warning("lockstep extraction of %s failed (%s); retrying them one at a time",
                            ", ".join(s["session"] for s in todo), failure)
                done = [self._one(s, {"lockstep_fallback": failure}) for s in todo]
            done = iter(done)
            records = [r if r is not None else next(done) for r in records]
        return records

    def _error(self, session: str, message: str) -> dict[str, Any]:
        return {"session": session, "mode": self.hparams.mode, "error": message,
                "meta": {"memory_policy": self.hparams.memory_policy}}

    def _one(self, batch: dict[str, Any], extra_meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """One session through the reference one-session path. ``extra_meta`` (a failed lockstep group's retry:
        ``{"lockstep_fallback": "<the group's error>"}``) says in the meta why it has no ``computed_*`` figures."""
        if "error" in batch:
            return self._error(batch["session"], batch["error"])
        hp = self.hparams
        record, failure = _attempt(lambda: self._checked(extract_session(
            self.runner, batch, hp.mode, hp.memory_s, hp.verify_rows, extra_meta, memory_policy=hp.memory_policy)))
        if failure is None:
            return record
        log.warning("extraction of %s failed: %s", batch.get("session"), failure)
        return self._error(batch.get("session", "?"), failure)

    def _many(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        hp = self.hparams
        if self.batched is None:
            if len(batch) > 1 and not self._warned_list:
                self._warned_list = True
                rank_zero_warn(f"the datamodule hands over {len(batch)} sessions per batch, but the model has "
                               "sessions_per_batch=1: they run one after another (set model.init_args."
                               "sessions_per_batch too)")
            return [self._one(s) for s in batch]
        return [self._checked(r) for r in extract_sessions(self.runner, list(batch), hp.mode, hp.memory_s,
                                                           hp.verify_rows, batched=self.batched,
                                                           memory_policy=hp.memory_policy)]

    def _checked(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record, or an error record when its states hold NaN or infinite values (never written as features)."""
        rows = nonfinite_rows(record["tensors"]["states"])
        if rows:
            log.warning("extraction of %s gave %d rows of non-finite states", record["session"], rows)
            return self._error(record["session"], f"{rows} rows of states are NaN or infinite (check the session's "
                                                  "media and the model's dtype)")
        return record
