"""Lockstep batched extraction (models/omni/batch.py, issue 12) on the tiny random thinker (fp32, CPU): identical
states and diagnostics to the one-session path in all three modes, the DESIGN §5 accounting table, the measured
``computed_*`` figures of each mode's reuse, the Lightning batched path, and the bench's ``--tiny`` smoke run; under
both memory policies (``window``, ``sliding``).

Bit-exactness needs the CPU GEMMs to round a row the same way whatever the row count of the call; MKL's small-M
kernels only do so with one intra-op thread (with several, a 1-10-row matmul can differ by ~1e-7 from the same rows
inside a larger one), so this module runs with ``torch.set_num_threads(1)``.
"""
import types
import warnings

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

from algorithms.streaming import (COMPLETED_BLOCK_HOLD, MEMORY_POLICIES, MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY,
                                  SLIDING, WINDOW, accounting, masks)
from lightning_modules.omni_extractor import OmniFeatureExtractor, extract_session, extract_sessions
from models.omni.thinker import OmniThinkerRunner
from models.omni.thinker_media import LOG_MEL_ATOL, video_inputs
from models.omni.batch import BREAKDOWN_PARTS, COMPUTED_FIELDS, BatchedOmniRunner, single_session_computed
from models.omni.tiny import build_tiny_omni

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
    """Lockstep session batching, one row per call (``batch_rows=False``): bit-identical to the one-session path."""
    streams = _streams()
    batched = BatchedOmniRunner(runner, sessions_per_batch=8, batch_rows=False).run_streams(
        streams, mode, memory_s=memory_s, verify_rows=3, memory_policy=policy)
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


@pytest.mark.parametrize("policy,memory_s", [(WINDOW, 4.0), (SLIDING, 2.0)])
def test_micro_rows_of_a_block_in_one_call(runner, policy, memory_s, monkeypatch):
    """batch_rows (default): the 10 micro rows of a native block go through the towers and the LLM as one call
    each. The states agree with the one-session path to fp32 rounding (other call shapes round differently; not
    bit for bit), everything counted is the same as row by row, and the LLM runs once per block (+ the window
    policy's re-prefill at each slide) instead of once per row."""
    streams = _streams()[:3]                                 # 6.0, 4.4 and 5.2 s: drop-outs inside a block
    calls = []
    forward = BatchedOmniRunner._forward
    monkeypatch.setattr(BatchedOmniRunner, "_forward", lambda self, e, p, c: calls.append(e.shape) or
                        forward(self, e, p, c))
    rows = BatchedOmniRunner(runner, 8).run_streams(streams, MICRO_CHUNK_200MS, memory_s=memory_s, verify_rows=3,
                                                    memory_policy=policy)
    n_rows_calls = len(calls)
    calls.clear()
    one = BatchedOmniRunner(runner, 8, batch_rows=False).run_streams(streams, MICRO_CHUNK_200MS,
                                                                      memory_s=memory_s, verify_rows=3,
                                                                      memory_policy=policy)
    for st, a, b in zip(streams, rows, one):
        ref = runner.run_stream(st["frames"], st["audio"], MICRO_CHUNK_200MS, memory_s=memory_s, verify_rows=3,
                                memory_policy=policy)
        assert torch.equal(b.states, ref.states)
        assert torch.allclose(a.states, ref.states, atol=1e-5, rtol=0) and not torch.equal(a.states, ref.states)
        assert a.steps == ref.steps and a.computed == b.computed
        assert a.verification["cache_replay"]["passed"]
    slides = 1 if policy == WINDOW else 0                    # window (4 s memory): one re-prefill, at block 2
    assert len(calls) == 30 + slides                         # row by row: one LLM call per row (6 s = 30 rows)
    # per block: rows 0-9, 10-19, then 20-21 (the 4.4 s stream drops out), 22-25 (the 5.2 s one), 26-29
    assert n_rows_calls == 5 + slides


@pytest.mark.parametrize("q_len,kv_len", [(5, 23), (7, 7)])
def test_lower_right_causal_sdpa_equals_the_library_masked_call(runner, q_len, kv_len):
    """A prefill of q tokens on a cache of kv - q: the lower-right causal bias gives the library's explicit-mask SDPA
    (GQA: keys and values repeated per query group, as the library does)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from models.omni.attention import lower_right_causal_sdpa

    attn = runner.thinker.model.language_model.layers[0].self_attn
    g = attn.num_key_value_groups
    torch.manual_seed(0)
    q = torch.randn(2, 2 * g, q_len, 8)
    k, v = torch.randn(2, 2, kv_len, 8), torch.randn(2, 2, kv_len, 8)
    keep = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)   # lower right
    mask = keep.expand(2, 1, q_len, kv_len)
    want, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=0.3)
    got, none = lower_right_causal_sdpa(attn, q, k, v, None, scaling=0.3, force=True)
    assert none is None and got.shape == want.shape == (2, q_len, 2 * g, 8)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    same, _ = lower_right_causal_sdpa(attn, q, k, v, mask, scaling=0.3)           # CPU, not forced: the library
    assert torch.equal(same, want)


@pytest.mark.parametrize("policy,memory_s", [(WINDOW, 4.0), (SLIDING, 2.0)])
@pytest.mark.parametrize("mode", MODES)
def test_batched_run_with_the_lower_right_prefill_forced(runner, mode, policy, memory_s, monkeypatch):
    """The whole batched run with every LLM prefill through the lower-right path (forced on the CPU; what runs on
    CUDA): the same states as the library's masked attention, to fp32 rounding."""
    from models.omni import attention as omni_batch

    streams = _streams()[:3]
    ref = BatchedOmniRunner(runner, 8).run_streams(streams, mode, memory_s=memory_s, verify_rows=2,
                                                   memory_policy=policy)
    calls = []
    original = omni_batch.lower_right_causal_sdpa

    def forced(*args, **kwargs):
        calls.append(args[1].shape[2])                          # query length of each prefill
        return original(*args, force=True, **kwargs)

    monkeypatch.setattr(omni_batch, "lower_right_causal_sdpa", forced)
    got = BatchedOmniRunner(runner, 8).run_streams(streams, mode, memory_s=memory_s, verify_rows=2,
                                                   memory_policy=policy)
    assert any(q >= 2 for q in calls)                           # the prefills took the lower-right path
    for a, b in zip(ref, got):
        assert torch.allclose(a.states, b.states, atol=1e-5, rtol=0)
        assert b.verification["cache_replay"]["passed"]


def test_lower_right_prefill_switch_is_scoped(runner, monkeypatch):
    """Installed while any thread is inside, removed by the last exit (interleaved threads too); out-of-memory is
    raised (not a reason to give the path up); under torch.compile the library's function runs."""
    import threading

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from models.omni import attention as omni_batch
    from models.omni.attention import _lower_right_prefill, lower_right_causal_sdpa

    lm = runner.thinker.model.language_model
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with _lower_right_prefill(lm, True):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is lower_right_causal_sdpa
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before and "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping
    with _lower_right_prefill(lm, False):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    # A enters, B enters, A exits, B exits: restored at the end, installed in between
    steps = [threading.Event() for _ in range(4)]
    seen = []

    def thread_a():
        with _lower_right_prefill(lm, True):
            steps[0].set()
            steps[1].wait(10)
        steps[2].set()

    def thread_b():
        steps[0].wait(10)
        with _lower_right_prefill(lm, True):
            steps[1].set()
            steps[2].wait(10)
            seen.append(ALL_ATTENTION_FUNCTIONS["sdpa"] is lower_right_causal_sdpa)

    ts = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert seen == [True] and ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    assert "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping

    attn = lm.layers[0].self_attn
    g = attn.num_key_value_groups
    q, k, v = torch.randn(1, 2 * g, 3, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    with monkeypatch.context() as m:
        m.setattr(omni_batch.F, "scaled_dot_product_attention", oom)
        with pytest.raises(torch.OutOfMemoryError):
            lower_right_causal_sdpa(attn, q, k, v, None, scaling=0.3, force=True)
    assert not omni_batch._LOWER_RIGHT_STATE["failed"]
    mask = torch.ones(3, 9, dtype=torch.bool).tril(6).expand(1, 1, 3, 9)
    compiled = torch.compile(lambda *t: lower_right_causal_sdpa(attn, *t, mask, scaling=0.3, force=True)[0],
                             backend="eager", fullgraph=True)       # the library's call: no graph break
    assert torch.allclose(compiled(q, k, v), lower_right_causal_sdpa(attn, q, k, v, mask, scaling=0.3)[0])


def test_reuse_off_gives_same_states_and_more_work(runner):
    streams = [dict(zip(("frames", "audio"), media(4.0, s))) for s in (0, 1)]
    on = BatchedOmniRunner(runner, 2).run_streams(streams, OPEN_STREAM_REPLAY, verify_rows=0)
    off = BatchedOmniRunner(runner, 2, reuse=False).run_streams(streams, OPEN_STREAM_REPLAY, verify_rows=0)
    assert all(torch.equal(a.states, b.states) for a, b in zip(on, off))
    assert off[0].computed["computed_vision_patches"] == SINGLE_PATCHES_4S[OPEN_STREAM_REPLAY] > \
        on[0].computed["computed_vision_patches"]


def test_batch_of_one_and_library_attention_agree(runner):
    streams = [dict(zip(("frames", "audio"), media(4.4, 3)))]
    a = BatchedOmniRunner(runner, 1, batch_rows=False).run_streams(streams, MICRO_CHUNK_200MS, verify_rows=0)[0]
    b = BatchedOmniRunner(runner, 1, batched_attention=False, batch_rows=False).run_streams(
        streams, MICRO_CHUNK_200MS, verify_rows=0)[0]
    assert torch.equal(a.states, b.states)


def test_chunk_lengths_read_once_per_cu_seqlens(runner, monkeypatch):
    """Every layer of a tower gets the same cu_seqlens object; its lengths go to the host once per object (not once
    per layer: a GPU wait each), and the states are unchanged."""
    import models.omni.attention as ob

    streams = [dict(zip(("frames", "audio"), media(2.0, s))) for s in (0, 1)]
    plain = BatchedOmniRunner(runner, 2).run_streams(streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    seen = []
    original = ob.chunk_lengths

    def spy(cu):
        seen.append((cu, getattr(cu, "_tb_chunk_lengths", None) is None))   # keeps cu alive: ids stay unique
        return original(cu)

    monkeypatch.setattr(ob, "chunk_lengths", spy)
    again = BatchedOmniRunner(runner, 2).run_streams(streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    objects = {id(cu) for cu, _ in seen}
    assert sum(first for _, first in seen) == len(objects) and len(seen) > len(objects)   # tiny towers: few layers
    assert all(torch.equal(a.states, b.states) for a, b in zip(plain, again))
    cu = torch.tensor([0, 3, 7, 7])
    assert original(cu) == [3, 4, 0] and original(cu) is original(cu)


def test_compile_flag_path(runner):
    streams = [dict(zip(("frames", "audio"), media(2.0, s))) for s in (0, 1)]
    plain = BatchedOmniRunner(runner, 2).run_streams(streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    comp = BatchedOmniRunner(runner, 2, compile_small_calls=True, compile_backend="eager").run_streams(
        streams, COMPLETED_BLOCK_HOLD, verify_rows=0)
    assert all(torch.allclose(a.states, b.states, atol=1e-6) for a, b in zip(plain, comp))
    assert not BatchedOmniRunner(runner).compile_small_calls  # off by default


def test_profile_breakdown_covers_the_wall_and_changes_nothing(runner):
    streams = [dict(zip(("frames", "audio"), media(6.0, s))) for s in (0, 1)]
    plain = BatchedOmniRunner(runner, 2)
    ref = plain.run_streams(streams, OPEN_STREAM_REPLAY, memory_s=4.0, verify_rows=0)
    assert plain.breakdown == {}  # off by default
    prof = BatchedOmniRunner(runner, 2, profile=True)
    got = prof.run_streams(streams, OPEN_STREAM_REPLAY, memory_s=4.0, verify_rows=0)
    assert all(torch.equal(a.states, b.states) for a, b in zip(ref, got))
    b = prof.breakdown
    assert list(b) == list(BREAKDOWN_PARTS) and all(v >= 0 for v in b.values())
    assert sum(b.values()) == pytest.approx(got[0].batch_wall_time_s, rel=1e-6)
    assert b["llm_reprefill"] > 0 and b["prep_audio"] > 0 and b["vision_tower"] > 0  # window slides at 4 s
    # several groups (one stream each): the parts add up to the groups' walls, "other" never goes negative
    two = BatchedOmniRunner(runner, 1, profile=True)
    res = two.run_streams(streams, OPEN_STREAM_REPLAY, memory_s=4.0, verify_rows=0)
    assert all(v >= 0 for v in two.breakdown.values())
    assert sum(two.breakdown.values()) == pytest.approx(sum(r.batch_wall_time_s for r in res), rel=1e-6)


def _official_log_mel(fe, waves):
    return torch.cat([fe(w, sampling_rate=16000, padding="longest", return_tensors="pt")["input_features"]
                      for w in waves])


def test_log_mel_equals_official_feature_extractor(runner):
    """``LogMel`` (one batched call over equal-length waveforms, the path both runners use) is bit-identical on CPU
    to the official ``WhisperFeatureExtractor`` call per waveform, at the real 128-mel shape; within ``LOG_MEL_ATOL``
    of the library's numpy implementation."""
    fe = runner.feature_extractor
    assert (fe.feature_size, fe.sampling_rate, fe.hop_length, fe.n_fft) == (128, 16000, 160, 400)  # official
    rng = np.random.default_rng(5)
    for seconds in (0.2, 1.2, 2.0):  # micro step, a replay tail, a native block
        n = int(seconds * 16000)
        waves = (0.1 * rng.standard_normal((8, n + fe.n_fft))).astype(np.float32)
        waves[3] *= 1e-3  # each waveform is clamped at its own maximum
        waves[5, n:] = 0.0  # the zero padding the runners add
        mine = runner.log_mel(torch.from_numpy(waves))
        ref = _official_log_mel(fe, waves)
        assert mine.shape == ref.shape == (8, 128, (n + fe.n_fft) // fe.hop_length)
        assert torch.equal(mine, ref)
        assert torch.equal(runner.log_mel(torch.from_numpy(waves[2:3])), ref[2:3])
        assert float((mine - torch.from_numpy(fe._np_extract_fbank_features(waves, "cpu"))).abs().max()) \
            <= LOG_MEL_ATOL


def _bench_video_processor(tmp_path):
    import importlib.util
    from pathlib import Path

    from transformers import AutoVideoProcessor

    path = Path(__file__).resolve().parents[3] / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    h, w = bench.FRAME_HW
    return AutoVideoProcessor.from_pretrained(bench.write_processors(tmp_path / "procs", h * w)), (h, w)


@pytest.mark.parametrize("shape", ["tiny", "resized", "real"])
def test_video_inputs_one_call_equals_official_per_clip(runner, tmp_path, shape):
    """All clips of a row in one ``video_inputs`` call (full and one-frame patches mixed) == the official processor
    on each clip alone (numpy frames, as the runners used to call it): bit-identical. ``resized``: 70x112 frames are
    resized to 56x112; ``real``: 560x1008 frames with the bench's processor (720 merged tokens per patch)."""
    vp, hw = runner.video_processor, {"tiny": (56, 84), "resized": (70, 112)}.get(shape)
    if shape == "real":
        vp, hw = _bench_video_processor(tmp_path)
    frames = np.random.default_rng(6).integers(0, 256, (5, *hw, 3), dtype=np.uint8)
    spans = [(0, 2), (2, 3), (3, 5)]
    got = video_inputs(vp, [torch.from_numpy(frames[a:z]).permute(0, 3, 1, 2) for a, z in spans])
    ref = [vp(videos=[torch.as_tensor(np.asarray(frames[a:z])).permute(0, 3, 1, 2)], return_tensors="pt",
              cap_pixels_per_frame=False) for a, z in spans]
    assert torch.equal(got["pixel_values_videos"], torch.cat([r["pixel_values_videos"] for r in ref]))
    assert torch.equal(got["video_grid_thw"], torch.cat([r["video_grid_thw"] for r in ref]))
    if shape == "real":
        assert got["video_grid_thw"].tolist() == [[1, 40, 72]] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_preprocessing_on_cuda(runner, tmp_path):
    """On CUDA: ``LogMel`` within ``LOG_MEL_ATOL`` of the official CPU call; ``video_inputs`` on device frames
    equal to the CPU call at the real frame size (no resize) and within one grey level where a resize runs."""
    fe = runner.feature_extractor
    rng = np.random.default_rng(7)
    for seconds in (0.2, 2.0):
        waves = (0.1 * rng.standard_normal((8, int(seconds * 16000) + fe.n_fft))).astype(np.float32)
        got = runner.log_mel(torch.from_numpy(waves).cuda())
        assert got.is_cuda
        assert float((got.cpu() - _official_log_mel(fe, waves)).abs().max()) <= LOG_MEL_ATOL
    vp, hw = _bench_video_processor(tmp_path)
    for proc, size, tol in ((vp, hw, 0.0), (runner.video_processor, (70, 112), 1.0 / (255 * 0.26) + 1e-5)):
        frames = torch.from_numpy(rng.integers(0, 256, (4, *size, 3), dtype=np.uint8)).permute(0, 3, 1, 2)
        cpu = video_inputs(proc, [frames[:2], frames[2:3]])
        dev = video_inputs(proc, [frames[:2].cuda(), frames[2:3].cuda()])
        assert dev["pixel_values_videos"].is_cuda and torch.equal(dev["video_grid_thw"], cpu["video_grid_thw"])
        assert float((dev["pixel_values_videos"].cpu() - cpu["pixel_values_videos"]).abs().max()) <= tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_close_to_single_session_on_cuda(model_dir):
    cuda = OmniThinkerRunner(model_dir, layer=-1).to("cuda")
    streams = _streams()[:3]
    for mode in MODES:
        batched = BatchedOmniRunner(cuda, 8).run_streams(streams, mode, memory_s=4.0, verify_rows=2,
                                                         memory_policy=SLIDING)
        for st, b in zip(streams, batched):
            ref = cuda.run_stream(st["frames"], st["audio"], mode, memory_s=4.0, verify_rows=0,
                                  memory_policy=SLIDING)
            assert torch.allclose(b.states, ref.states, atol=1e-4, rtol=1e-4), mode
            assert b.verification["cache_replay"]["passed"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lower_right_flash_prefill_on_cuda_bf16(model_dir):
    """bf16 on CUDA: the lower-right causal prefill (flash kernel) against the library's masked SDPA, every mode;
    the flash path must not have fallen back."""
    from models.omni import attention as omni_batch

    cuda = OmniThinkerRunner(model_dir, layer=-1, dtype="bfloat16").to("cuda")
    streams = _streams()[:3]
    for mode in MODES:
        fast = BatchedOmniRunner(cuda, 8).run_streams(streams, mode, memory_s=4.0, verify_rows=0,
                                                      memory_policy=SLIDING)
        lib = BatchedOmniRunner(cuda, 8, flash_prefill=False).run_streams(streams, mode, memory_s=4.0,
                                                                          verify_rows=0, memory_policy=SLIDING)
        for a, b in zip(fast, lib):
            live = b.states.abs().sum(1) > 0                    # rows before the first update hold zeros
            assert torch.equal(live, a.states.abs().sum(1) > 0)
            cos = torch.nn.functional.cosine_similarity(a.states[live], b.states[live], dim=1)
            assert cos.min() > 0.99, (mode, float(cos.min()))
    assert not omni_batch._LOWER_RIGHT_STATE["failed"] and not omni_batch._LOWER_RIGHT_STATE["no_native_gqa"]
    # the 3B thinker's prefill shapes (16 query heads on 2 key/value heads of 128, bf16) take the direct flash call
    q = torch.randn(8, 16, 64, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(8, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    assert omni_batch._native_gqa_flash(q, kv, kv, 0.0)


def test_sdpa_without_cudnn_leave_cudnn_out_and_keep_what_the_caller_turned_off():
    """The towers' CUDA backend set is flash, memory-efficient and math minus whatever the caller had turned off;
    SDPA's switches are restored on exit; nothing changes for the CPU (the switches are global, so this runs
    without a GPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from models.vision_attention import allow_cudnn_sdpa
    from models.vision_attention import sdpa_without_cudnn as _sdpa_without_cudnn

    cuda = torch.backends.cuda

    def flags():
        return (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
                cuda.cudnn_sdp_enabled())

    before = flags()
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION]):
        with _sdpa_without_cudnn(torch.device("cuda")):
            assert flags() == (False, True, True, False)       # flash stays off (the caller's), cuDNN left out
        assert flags() == (False, True, True, True)
        with _sdpa_without_cudnn(torch.device("cpu")):
            assert flags() == (False, True, True, True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        with _sdpa_without_cudnn(torch.device("cuda")):
            assert flags() == (True, False, False, False)
        allow_cudnn_sdpa(True)                             # A/B switch: SDPA's own choice again
        try:
            with _sdpa_without_cudnn(torch.device("cuda")):
                assert flags() == (True, False, False, True)
        finally:
            allow_cudnn_sdpa(False)
    assert flags() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("q_len,kv_len", [(37, 300), (64, 64), (2, 1500)])
def test_flash_on_unrepeated_keys_equals_the_repeated_lower_right_call(q_len, kv_len):
    """bf16 on CUDA, the 3B thinker's heads (16 query heads of 128 on 2 key/value heads): flash called directly on
    the un-repeated keys/values equals the library's masked call on repeated ones, and the direct path was taken."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from models.omni import attention as omni_batch

    attn = types.SimpleNamespace(is_causal=True, num_key_value_groups=8, training=False)
    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(3, 16, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(3, 2, kv_len, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    assert omni_batch._native_gqa_flash(q, k, v, 0.0)
    calls = []
    real = torch.ops.aten._scaled_dot_product_flash_attention

    def counted(*a, **kw):
        calls.append(a[1].shape[1])
        return real(*a, **kw)

    keep = torch.ones(q_len, kv_len, dtype=torch.bool, device="cuda").tril(kv_len - q_len)
    want, _ = sdpa_attention_forward(attn, q.float(), k.float(), v.float(), keep.expand(3, 1, q_len, kv_len),
                                     scaling=128 ** -0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention", counted, raising=False)
        got, _ = omni_batch.lower_right_causal_sdpa(attn, q, k, v, None, scaling=128 ** -0.5, force=True)
    assert calls == [2] and not omni_batch._LOWER_RIGHT_STATE["no_native_gqa"]   # un-repeated: 2 key heads
    assert got.shape == (3, q_len, 16, 128)
    assert (got.float() - want).abs().max() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tower_chunk_attention_leaves_cudnn_out_and_equals_the_loop():
    """The towers' batched chunk attention on CUDA runs without cuDNN's backend and equals the library's
    per-chunk loop (one SDPA call per chunk) to bf16 rounding, for equal and for mixed chunk lengths."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from models.omni.attention import _chunk_attention

    mod = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="sdpa"), scaling=80 ** -0.5,
                                is_causal=False, num_key_value_groups=1, training=False)
    seen, before = [], torch.backends.cuda.cudnn_sdp_enabled()
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*a, **kw)

    for lengths in ([64] * 45, [64] * 20 + [16, 64, 16]):
        cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(1, 16, sum(lengths), 80, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
            got = _chunk_attention(mod, q, k, v, cu)
        want = torch.cat([sdpa_attention_forward(mod, *(t[:, :, a:b] for t in (q, k, v)), None, scaling=mod.scaling)[0]
                          for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], 1).reshape(sum(lengths), -1)
        assert got.shape == want.shape and (got.float() - want.float()).abs().max() < 2e-2
    assert seen and not any(seen) and torch.backends.cuda.cudnn_sdp_enabled() == before


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
        assert extra == set(COMPUTED_FIELDS) | {"sessions_per_batch", "batch_wall_time_s"}   # batch_rows: micro only
        assert {k: v for k, v in rec["meta"].items() if k not in drop | extra} == \
            {k: v for k, v in ref["meta"].items() if k not in drop}
    # the three streams ran as one lockstep group: each session's batch wall is that group's, counted once even for
    # Session_2's two streams
    assert batched[0]["meta"]["batch_wall_time_s"] == batched[1]["meta"]["batch_wall_time_s"] > 0
    # stream 1: one 2 s block of tails (11 s of audio); stream 2 (12 rows): 11 s + the 0.2 and 0.4 s tails
    assert batched[1]["meta"]["computed_audio_seconds"] == pytest.approx(11.0 + 11.0 + 0.2 + 0.4)
    live = OmniFeatureExtractor(str(model_dir), mode=MICRO_CHUNK_200MS, sessions_per_batch=2, batch_rows=False)
    assert live.batched.batch_rows is False and live.hparams.batch_rows is False and live.batched.flash_prefill
    assert OmniFeatureExtractor(str(model_dir), sessions_per_batch=2, flash_prefill=False).batched.flash_prefill is False
    micro = extract_sessions(runner, sessions[:1], MICRO_CHUNK_200MS, 8.0, verify_rows=0, batched=live.batched)
    assert micro[0]["meta"]["batch_rows"] is False
    assert micro[0]["meta"]["verification"]["cache_replay"]["checked_rows"] == 0
    per_stream = micro[0]["meta"]["verification"]["cache_replay"]["per_stream"]
    assert [v["micro_chunk_vs_continuous_semantics"]["applicable"] for v in per_stream] == [False]   # no row checked
    assert micro[0]["meta"]["verification"]["micro_chunk_vs_continuous_semantics"]["applicable"] is False
    assert batched[0]["meta"]["verification"]["cache_replay"]["checked_rows"] == 2    # verify_rows=2, one stream
    with pytest.warns(UserWarning, match="hands over one session at a time"):
        one = live.predict_step(sessions[0])              # a dict: the one-session path, once warned
    assert one["session"] == "Session_1" and live._warned_single
    single = OmniFeatureExtractor(str(model_dir), mode=COMPLETED_BLOCK_HOLD, verify_rows=0)
    with pytest.warns(UserWarning, match="hands over 2 sessions per batch, but the model has sessions_per_batch=1"):
        recs = single.predict_step(sessions)              # a list on the one-session model: one after another
    assert [r["session"] for r in recs] == ["Session_1", "Session_2"] and single._warned_list
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # once
        single.predict_step(sessions)
    with pytest.warns(UserWarning, match="batch_rows=False has no effect"):
        OmniFeatureExtractor(str(model_dir), mode=COMPLETED_BLOCK_HOLD, batch_rows=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # the default micro config is told in an info line, no warning
        OmniFeatureExtractor(str(model_dir), mode=MICRO_CHUNK_200MS)
    module = OmniFeatureExtractor(str(model_dir), mode=COMPLETED_BLOCK_HOLD, verify_rows=1, sessions_per_batch=2)
    recs = module.predict_step(sessions)
    assert [r["session"] for r in recs] == ["Session_1", "Session_2"]
    assert recs[0]["meta"]["production_processor_calls"] == 2 and recs[0]["meta"]["computed_vision_patches"] == 4
    with pytest.warns(UserWarning, match="hands over one session at a time"):
        one = module.predict_step(sessions[0])
    assert torch.equal(one["tensors"]["states"], recs[0]["tensors"]["states"])
    with pytest.raises(ValueError, match="sessions_per_batch"):
        OmniFeatureExtractor(str(model_dir), sessions_per_batch=0)


def test_bench_tiny_smoke(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--tiny", "--sessions", "2", "--duration", "6", "--memory", "4"])  # slides at 4 s
    assert [(r["mode"], r["policy"], r["sessions"]) for r in rows] == \
        [(m, p, n) for m in MODES for p, n in ((WINDOW, 1), (WINDOW, 2), (SLIDING, 2))]
    # bit-identical, except micro rows batched per block (fp32 rounding of other call shapes)
    assert all(r["max_abs_diff"] <= (1e-5 if r["mode"] == MICRO_CHUNK_200MS and r["path"] != "1-session eager"
                                     else 0.0) and r["rtf"] > 0 and r["dataset_rtf"] > 0 for r in rows)
    for m in MODES:  # sliding prefills fewer LLM tokens than window (no re-prefill of kept blocks)
        w, s = (r["llm_tokens_per_s"] for r in rows if r["mode"] == m and r["sessions"] == 2)
        assert s < w
    out = capsys.readouterr().out
    assert "| mode | path | policy | sessions |" in out and "| batched 2 + reuse | sliding |" in out
    assert "where the batched wall time goes" not in out and all("breakdown" not in r for r in rows)
    only = bench.main(["--tiny", "--sessions", "2", "--duration", "2", "--modes", COMPLETED_BLOCK_HOLD,
                       "--memory-policy", SLIDING, "--breakdown"])
    assert [(r["policy"], r["sessions"]) for r in only] == [(WINDOW, 1), (SLIDING, 2)]
    assert "breakdown" not in only[0] and set(only[1]["breakdown"]) == set(BREAKDOWN_PARTS)
    out = capsys.readouterr().out
    assert "## where the batched wall time goes" in out
    assert "| completed-block-hold | sliding | 2 |" in out.split("where the batched wall time goes")[1]
    cfg = bench.omni_3b_thinker_config()
    t = cfg.text_config
    assert (t.num_hidden_layers, t.hidden_size, t.intermediate_size, t.num_attention_heads,
            t.num_key_value_heads) == (36, 2048, 11008, 16, 2)
    h, w = bench.FRAME_HW
    assert (h // 28) * (w // 28) == 720


def test_bench_builds_the_real_shape_runner(tmp_path, monkeypatch):
    """The bench's non-tiny path (random bf16 thinker built in memory + the official processors written to a folder)
    gives a runner; here with the tiny config in place of the 3B one."""
    import importlib.util
    from pathlib import Path

    from models.omni.tiny import tiny_omni_config

    path = Path(__file__).resolve().parents[3] / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "omni_3b_thinker_config", tiny_omni_config)
    r = bench.build_runner(False, "cpu", tmp_path)
    assert r.dtype == torch.bfloat16 and r.video_processor.size["longest_edge"] == 560 * 1008
    frames, audio = media(2.0, hw=bench.FRAME_HW)
    res = BatchedOmniRunner(r, 1).run_streams([{"frames": frames, "audio": audio}], COMPLETED_BLOCK_HOLD,
                                               verify_rows=0)[0]
    assert res.computed["computed_vision_patches"] == 2 and torch.count_nonzero(res.states[9]) > 0
