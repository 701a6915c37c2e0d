"""Lockstep batched extraction (models/omni_batch.py, issue 12) on the tiny random thinker (fp32, CPU): identical
states and diagnostics to the one-session path in all three modes, the DESIGN §5 accounting table, the measured
``computed_*`` figures of each mode's reuse, the Lightning batched path, and the bench's ``--tiny`` smoke run; under
both memory policies (``window``, ``sliding``).

Bit-exactness needs the CPU GEMMs to round a row the same way whatever the row count of the call; MKL's small-M
kernels only do so with one intra-op thread (with several, a 1-10-row matmul can differ by ~1e-7 from the same rows
inside a larger one), so this module runs with ``torch.set_num_threads(1)``.
"""
import warnings

import numpy as np
import pytest
import torch

from algorithms.streaming import (COMPLETED_BLOCK_HOLD, MEMORY_POLICIES, MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY,
                                  SLIDING, WINDOW, accounting, masks)
from lightning_modules.omni_extractor import OmniFeatureExtractor, extract_session, extract_sessions
from models.omni import OmniThinkerRunner
from models.omni_batch import COMPUTED_FIELDS, BatchedOmniRunner, single_session_computed
from models.tiny_omni import build_tiny_omni

TABLE_4S = {OPEN_STREAM_REPLAY: (20, 22.0, list(range(20)), [9, 19]),
            COMPLETED_BLOCK_HOLD: (2, 4.0, [9, 19], [9, 19]),
            MICRO_CHUNK_200MS: (20, 4.0, list(range(20)), list(range(20)))}
# what the batched path computes for one 4 s stream (2 blocks), and what the one-session path computes
COMPUTED_4S = {  # (processor calls, audio s, video s, vision patches)
    OPEN_STREAM_REPLAY: (20 + 12, 22.0, 8.0, 12),  # per block: partial (f0) x2, (f0,f1) once, (f2) x2, (f2,f3) once
    COMPLETED_BLOCK_HOLD: (4, 4.0, 4.0, 4),
    MICRO_CHUNK_200MS: (28, 4.0, 4.0, 8),
}
SINGLE_PATCHES_4S = {OPEN_STREAM_REPLAY: 22, COMPLETED_BLOCK_HOLD: 4, MICRO_CHUNK_200MS: 8}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_omni(tmp_path_factory.mktemp("tiny_omni_batch"))


@pytest.fixture(scope="module")
def runner(model_dir):
    return OmniThinkerRunner(model_dir, layer=-1)


def media(seconds, seed=0, hw=(56, 84)):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (int(seconds * 2), *hw, 3), dtype=np.uint8)
    audio = (0.1 * rng.standard_normal(int(round(seconds * 16000)))).astype(np.float32)
    return frames, audio


def _streams():
    out = [dict(zip(("frames", "audio"), media(s, i))) for i, s in enumerate((6.0, 4.4, 5.2))]
    f, a = media(5.0, 7)
    out.append({"frames": f[:7], "audio": a})  # frames run out at 3.5 s: its own group, as the one-session path
    f, a = media(3.0, 8, hw=(70, 112))
    out.append({"frames": f, "audio": a})  # another frame size: another group
    return out


@pytest.mark.parametrize("policy,memory_s", [(WINDOW, 4.0), (SLIDING, 2.0)])  # sliding: 2 evictions in 6 s
@pytest.mark.parametrize("mode", MODES)
def test_batched_identical_to_single_session(runner, mode, policy, memory_s):
    streams = _streams()
    batched = BatchedOmniRunner(runner, sessions_per_batch=8).run_streams(streams, mode, memory_s=memory_s,
                                                                          verify_rows=3, memory_policy=policy)
    for st, b in zip(streams, batched):
        ref = runner.run_stream(st["frames"], st["audio"], mode, memory_s=memory_s, verify_rows=3,
                                memory_policy=policy)
        assert torch.equal(b.states, ref.states)
        assert b.steps == ref.steps and masks(b.steps) == masks(ref.steps)
        assert (b.processor_calls, b.prepared_media_s) == (ref.processor_calls, ref.prepared_media_s)
        assert b.verification == ref.verification and b.verification["cache_replay"]["passed"]
        assert b.verification["cache_replay"]["memory_policy"] == policy
    assert batched[0].batch_size == 3 and batched[3].batch_size == 1 and batched[4].batch_size == 1


def test_batched_sliding_cache_replay_can_fail(runner, monkeypatch):
    """With the eviction disabled the batched sliding cache keeps evicted blocks: the independent reference says so."""
    streams = [dict(zip(("frames", "audio"), media(6.0, s))) for s in (0, 1)]
    monkeypatch.setattr(OmniThinkerRunner, "_evict_rows", staticmethod(lambda cache, start, length: None))
    res = BatchedOmniRunner(runner, 2).run_streams(streams, MICRO_CHUNK_200MS, memory_s=2.0, verify_rows=3,
                                                   memory_policy=SLIDING)
    assert all(not r.verification["cache_replay"]["passed"] for r in res)


# 56x84 frames -> a 4x6 patch grid -> 2x3 = 6 merged tokens per temporal patch
TOKENS_PER_BLOCK = {COMPLETED_BLOCK_HOLD: 2 * 6 + 50,  # one payload: 2 temporal patches + 50 audio tokens
                    MICRO_CHUNK_200MS: 10 * 5 + 4 * 6}  # 10 payloads of 5 audio tokens; each frame its own patch


@pytest.mark.parametrize("mode", list(TOKENS_PER_BLOCK))
def test_computed_llm_tokens_by_policy(runner, mode):
    """8 s at 4 s memory (M = 2): the window slides at blocks 2 and 3. Sliding prefills each block once; window
    also re-prefills the one kept block at each slide."""
    streams = [dict(zip(("frames", "audio"), media(8.0, 0)))]
    n = TOKENS_PER_BLOCK[mode]
    got = {p: BatchedOmniRunner(runner, 1).run_streams(streams, mode, memory_s=4.0, verify_rows=0,
                                                       memory_policy=p)[0].computed["computed_llm_tokens"]
           for p in MEMORY_POLICIES}
    assert got == {SLIDING: 4 * n, WINDOW: 4 * n + 2 * n}


def test_sliding_position_warning_once_per_stream(runner, monkeypatch):
    monkeypatch.setattr(runner.text_config, "max_position_embeddings", 80)  # block 1 reaches O + 99 = 108
    streams = [dict(zip(("frames", "audio"), media(4.0, s))) for s in (0, 1)]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        runner.run_stream(streams[0]["frames"], streams[0]["audio"], COMPLETED_BLOCK_HOLD, verify_rows=0,
                          memory_policy=SLIDING)
        BatchedOmniRunner(runner, 2).run_streams(streams, COMPLETED_BLOCK_HOLD, verify_rows=0, memory_policy=SLIDING)
        runner.run_stream(streams[0]["frames"], streams[0]["audio"], COMPLETED_BLOCK_HOLD, verify_rows=0)
    msgs = [str(w.message) for w in rec if "max_position_embeddings" in str(w.message)]
    assert len(msgs) == 3 and all("a 4 s stream reaches TMRoPE position 108" in m for m in msgs), msgs


@pytest.mark.parametrize("policy", MEMORY_POLICIES)
@pytest.mark.parametrize("mode", MODES)
def test_four_second_table_and_computed(runner, mode, policy):
    streams = [dict(zip(("frames", "audio"), media(4.0, s))) for s in (0, 1)]
    res = BatchedOmniRunner(runner, sessions_per_batch=2).run_streams(streams, mode, verify_rows=0,
                                                                      memory_policy=policy)
    calls, prep, update, commit = TABLE_4S[mode]
    for r in res:
        a = accounting(r.steps)
        assert r.states.shape == (20, runner.hidden_size)
        assert (r.processor_calls, r.prepared_media_s) == (calls, prep) == (a.processor_calls, a.prepared_media_s)
        assert (a.state_update_rows, a.payload_commit_rows, a.native_boundary_rows) == (update, commit, [9, 19])
        c = r.computed
        assert set(c) == set(COMPUTED_FIELDS)
        assert (c["computed_processor_calls"], c["computed_audio_seconds"], c["computed_video_seconds"],
                c["computed_vision_patches"]) == COMPUTED_4S[mode]
        assert c["computed_encoder_seconds_of_media"] == c["computed_audio_seconds"] + c["computed_video_seconds"]
        single = single_session_computed(r.steps, 8, runner.geometry)
        assert single["computed_vision_patches"] == SINGLE_PATCHES_4S[mode]
        assert single["computed_audio_seconds"] == c["computed_audio_seconds"]  # audio: never reusable


def test_reuse_off_gives_same_states_and_more_work(runner):
    streams = [dict(zip(("frames", "audio"), media(4.0, s))) for s in (0, 1)]
    on = BatchedOmniRunner(runner, 2).run_streams(streams, OPEN_STREAM_REPLAY, verify_rows=0)
    off = BatchedOmniRunner(runner, 2, reuse=False).run_streams(streams, OPEN_STREAM_REPLAY, verify_rows=0)
    assert all(torch.equal(a.states, b.states) for a, b in zip(on, off))
    assert off[0].computed["computed_vision_patches"] == SINGLE_PATCHES_4S[OPEN_STREAM_REPLAY] > \
        on[0].computed["computed_vision_patches"]


def test_batch_of_one_and_library_attention_agree(runner):
    streams = [dict(zip(("frames", "audio"), media(4.4, 3)))]
    a = BatchedOmniRunner(runner, 1).run_streams(streams, MICRO_CHUNK_200MS, verify_rows=0)[0]
    b = BatchedOmniRunner(runner, 1, batched_attention=False).run_streams(streams, MICRO_CHUNK_200MS,
                                                                          verify_rows=0)[0]
    assert torch.equal(a.states, b.states)


def test_compile_flag_path(runner):
    streams = [dict(zip(("frames", "audio"), media(2.0, s))) for s in (0, 1)]
    plain = BatchedOmniRunner(runner, 2).run_streams(streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    comp = BatchedOmniRunner(runner, 2, compile_small_calls=True, compile_backend="eager").run_streams(
        streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    assert all(torch.allclose(a.states, b.states, atol=1e-6) for a, b in zip(plain, comp))
    assert not BatchedOmniRunner(runner).compile_small_calls  # off by default


def _session(name, spans, seed):
    streams = []
    for k, (start, dur) in enumerate(spans):
        f, a = media(dur, seed + k)
        streams.append({"start_s": start, "frames": torch.from_numpy(f), "audio": torch.from_numpy(a)})
    return {"session": name, "timeline_end_s": max(s + d for s, d in spans), "gap_policy": "reset",
            "streams": streams}


def test_extract_sessions_records_match_and_lightning_list_batch(runner, model_dir):
    sessions = [_session("Session_1", [(0.0, 4.0)], 0), _session("Session_2", [(0.0, 2.0), (3.0, 2.4)], 10)]
    batched = extract_sessions(runner, sessions, OPEN_STREAM_REPLAY, 8.0, verify_rows=2, sessions_per_batch=4)
    for s, rec in zip(sessions, batched):
        ref = extract_session(runner, s, OPEN_STREAM_REPLAY, 8.0, verify_rows=2)
        assert rec["session"] == ref["session"] and rec["mode"] == ref["mode"]
        assert all(torch.equal(rec["tensors"][k], ref["tensors"][k]) for k in ref["tensors"])
        drop = {"wall_time_s", "peak_memory_bytes"}
        extra = set(rec["meta"]) - set(ref["meta"])
        assert extra == set(COMPUTED_FIELDS) | {"sessions_per_batch", "batch_wall_time_s"}
        assert {k: v for k, v in rec["meta"].items() if k not in drop | extra} == \
            {k: v for k, v in ref["meta"].items() if k not in drop}
    # stream 1: one 2 s block of tails (11 s of audio); stream 2 (12 rows): 11 s + the 0.2 and 0.4 s tails
    assert batched[1]["meta"]["computed_audio_seconds"] == pytest.approx(11.0 + 11.0 + 0.2 + 0.4)
    module = OmniFeatureExtractor(str(model_dir), mode=COMPLETED_BLOCK_HOLD, verify_rows=1, sessions_per_batch=2)
    recs = module.predict_step(sessions)
    assert [r["session"] for r in recs] == ["Session_1", "Session_2"]
    assert recs[0]["meta"]["production_processor_calls"] == 2 and recs[0]["meta"]["computed_vision_patches"] == 4
    one = module.predict_step(sessions[0])
    assert torch.equal(one["tensors"]["states"], recs[0]["tensors"]["states"])
    with pytest.raises(ValueError, match="sessions_per_batch"):
        OmniFeatureExtractor(str(model_dir), sessions_per_batch=0)


def test_bench_tiny_smoke(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--tiny", "--sessions", "2", "--duration", "6", "--memory", "4"])  # slides at 4 s
    assert [(r["mode"], r["policy"], r["sessions"]) for r in rows] == \
        [(m, p, n) for m in MODES for p, n in ((WINDOW, 1), (WINDOW, 2), (SLIDING, 2))]
    assert all(r["max_abs_diff"] == 0.0 and r["rtf"] > 0 and r["dataset_rtf"] > 0 for r in rows)
    for m in MODES:  # sliding prefills fewer LLM tokens than window (no re-prefill of kept blocks)
        w, s = (r["llm_tokens_per_s"] for r in rows if r["mode"] == m and r["sessions"] == 2)
        assert s < w
    out = capsys.readouterr().out
    assert "| mode | path | policy | sessions |" in out and "| batched 2 + reuse | sliding |" in out
    only = bench.main(["--tiny", "--sessions", "2", "--duration", "2", "--modes", COMPLETED_BLOCK_HOLD,
                       "--memory-policy", SLIDING])
    assert [(r["policy"], r["sessions"]) for r in only] == [(WINDOW, 1), (SLIDING, 2)]
    cfg = bench.omni_3b_thinker_config()
    t = cfg.text_config
    assert (t.num_hidden_layers, t.hidden_size, t.intermediate_size, t.num_attention_heads,
            t.num_key_value_heads) == (36, 2048, 11008, 16, 2)
    h, w = bench.FRAME_HW
    assert (h // 28) * (w // 28) == 720
