"""Window re-prefills of several slides in one LLM call (``BatchedOmniRunner(reprefill_slides=K)``, issue 33 item 4)
on the tiny random thinker (fp32, CPU, one thread as ``test_omni_batch.py``): K = 1 is the one-session path bit for
bit; K = 2, 3 give the K = 1 states within the lockstep tests' tolerance, the same computed tokens and the
hand-counted calls, with streams finishing inside a group of slides and slides whose kept layouts differ.
``fuse_slide_rows`` (issue 41 item 4: the slide row's payloads in the re-prefill call) gives the one-session states
within the same tolerance, the same computed figures and one LLM call per K slides instead of 1/K + 1 per slide.
"""
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

from algorithms.streaming import (COMPLETED_BLOCK_HOLD, MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY, SLIDING,
                                  WINDOW)
from models.omni.batch import REPREFILL_SLIDES_MAX, BatchedOmniRunner, reprefill_bytes_per_token
from models.omni.thinker import OmniThinkerRunner
from models.omni.tiny import build_tiny_omni

MEMORY_S = 4.0  # M = 2: the window slides at every block from block 2 on and keeps one block
LENGTHS_S = (12.0, 9.4, 10.2)  # 60, 47 and 51 rows: the two shorter streams finish inside a group of slides
TOKENS_PER_BLOCK = 2 * 6 + 50  # hold: 56x84 frames -> 6 merged tokens per temporal patch, 2 patches + 50 audio


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return OmniThinkerRunner(build_tiny_omni(tmp_path_factory.mktemp("tiny_omni_reprefill")), layer=-1)


def media(seconds, seed=0, hw=(56, 84)):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (int(seconds * 2), *hw, 3), dtype=np.uint8)
    audio = (0.1 * rng.standard_normal(int(round(seconds * 16000)))).astype(np.float32)
    return frames, audio


def _streams():
    return [dict(zip(("frames", "audio"), media(s, i))) for i, s in enumerate(LENGTHS_S)]


def _count_calls(monkeypatch):
    """Record the batched re-prefill calls (rows, tokens) and the LLM calls of the one-slide path."""
    calls = {"ahead": [], "forward": []}
    reprefill, forward = BatchedOmniRunner._reprefill, BatchedOmniRunner._forward
    monkeypatch.setattr(BatchedOmniRunner, "_reprefill", lambda self, e, p, c: calls["ahead"].append(
        tuple(e.shape[:2])) or reprefill(self, e, p, c))
    monkeypatch.setattr(BatchedOmniRunner, "_forward", lambda self, e, p, c: calls["forward"].append(
        tuple(e.shape[:2])) or forward(self, e, p, c))
    return calls


@pytest.mark.parametrize("mode,batch_rows", [(m, False) for m in MODES] + [(MICRO_CHUNK_200MS, True)])
def test_slides_in_one_call_equal_one_call_per_slide(runner, mode, batch_rows):
    """K = 1 equals the one-session path over 2-4 slides per stream (bit for bit row by row; micro's rows of a block
    in one call: to fp32 rounding, as ``test_micro_rows_of_a_block_in_one_call``); K = 2, 3 equal K = 1 within the
    lockstep tests' tolerance, with the same tokens prefilled, fewer re-prefill calls and a passing cache_replay."""
    streams = _streams()
    res = {k: BatchedOmniRunner(runner, 8, reprefill_slides=k, batch_rows=batch_rows).run_streams(
        streams, mode, memory_s=MEMORY_S, verify_rows=3) for k in (1, 2, 3)}
    for st, one in zip(streams, res[1]):
        ref = runner.run_stream(st["frames"], st["audio"], mode, memory_s=MEMORY_S, verify_rows=3)
        if batch_rows:
            assert torch.allclose(one.states, ref.states, atol=1e-5, rtol=0)
        else:
            assert torch.equal(one.states, ref.states)
            assert one.verification == ref.verification
    for k in (2, 3):
        for one, got in zip(res[1], res[k]):
            assert torch.allclose(got.states, one.states, atol=1e-5, rtol=0)
            assert got.verification["cache_replay"]["passed"]
            assert {f: v for f, v in got.computed.items() if f != "computed_reprefill_calls"} == \
                {f: v for f, v in one.computed.items() if f != "computed_reprefill_calls"}
            assert got.computed["computed_reprefill_calls"] < one.computed["computed_reprefill_calls"]


def test_hold_call_counts_by_hand(runner, monkeypatch):
    """Hold at M = 2: a stream slides at the boundary row of each block >= 2 it reaches (rows 29, 39, 49, 59), and
    keeps one 62-token block. 12 s: 4 slides, 9.4 s (47 rows): 2, 10.2 s (51 rows): 3. K = 2 groups slides
    {2, 3} and {4, 5}: one call each (slide 5 has the 12 s stream only, slide 4 the 12 s and 10.2 s ones); K = 3
    groups {2, 3, 4} in one call, slide 5 (alone) takes the one-slide path."""
    calls = _count_calls(monkeypatch)
    streams = _streams()
    n = TOKENS_PER_BLOCK
    want_calls = {1: [4, 2, 3], 2: [2, 1, 2], 3: [2, 1, 1]}
    # (rows, tokens) of the batched calls: K = 2: slides 2, 3 (3 streams each), slides 4, 5 (2 + 1 streams)
    want_ahead = {1: [], 2: [(6, n), (3, n)], 3: [(8, n)]}
    want_forward_reprefills = {1: [(3, n), (3, n), (2, n), (1, n)], 2: [], 3: [(1, n)]}
    for k in (1, 2, 3):
        calls["ahead"].clear()
        calls["forward"].clear()
        res = BatchedOmniRunner(runner, 8, reprefill_slides=k).run_streams(streams, COMPLETED_BLOCK_HOLD,
                                                                           memory_s=MEMORY_S, verify_rows=0)
        assert [r.computed["computed_reprefill_calls"] for r in res] == want_calls[k]
        # payloads: 6, 4 and 5 committed blocks; plus one kept block per slide
        assert [r.computed["computed_llm_tokens"] for r in res] == [(6 + 4) * n, (4 + 2) * n, (5 + 3) * n]
        assert calls["ahead"] == want_ahead[k]
        payload_calls = [(3, n)] * 4 + [(2, n)] + [(1, n)]  # boundary rows 9..59, batch shrinking at 47 and 51
        assert sorted(calls["forward"]) == sorted(payload_calls + want_forward_reprefills[k])


_SHORT_S = (6.2, 4.2)  # 31 and 21 rows: slide 2 (row 20) has both streams, slide 3 (row 30) the 6.2 s one only


@pytest.mark.parametrize("mode,batch_rows,lengths,ks", [
    (COMPLETED_BLOCK_HOLD, False, LENGTHS_S, (1, 3)), (OPEN_STREAM_REPLAY, False, _SHORT_S, (3,)),  # default twins
    *[pytest.param(m, b, LENGTHS_S, (1, 3), marks=pytest.mark.slow)
      for m, b in ((OPEN_STREAM_REPLAY, False), (MICRO_CHUNK_200MS, False), (MICRO_CHUNK_200MS, True))]])
def test_fused_slide_rows_equal_the_one_session_path(runner, mode, batch_rows, lengths, ks):
    """The slide row's payloads prefilled in the re-prefill call (K = 1: one call per slide; K = 3: the calls of
    several slides) give the one-session states within the lockstep tests' tolerance (1e-5), a passing
    cache_replay (4 rows, the last after the slides), and the unfused run's computed figures (tokens, encoder work; the re-prefill
    calls of the same K, except where a stream finishing inside a micro block's run splits the fused layouts).
    Replay's slide row is a temporary 0.2 s tail: only the kept blocks' keys/values stay in the cache."""
    streams = [dict(zip(("frames", "audio"), media(s, i))) for i, s in enumerate(lengths)]
    refs = [runner.run_stream(st["frames"], st["audio"], mode, memory_s=MEMORY_S, verify_rows=0) for st in streams]
    for k in ks:
        kw = dict(reprefill_slides=k, batch_rows=batch_rows)
        plain = BatchedOmniRunner(runner, 8, **kw).run_streams(streams, mode, memory_s=MEMORY_S, verify_rows=0)
        fused = BatchedOmniRunner(runner, 8, fuse_slide_rows=True, **kw).run_streams(
            streams, mode, memory_s=MEMORY_S, verify_rows=4)
        for ref, one, got in zip(refs, plain, fused):
            assert torch.allclose(got.states, ref.states, atol=1e-5, rtol=0)
            assert got.verification["cache_replay"]["passed"] and got.verification["cache_replay"]["rows"]
            same = {f: v for f, v in got.computed.items() if f != "computed_reprefill_calls"}
            assert same == {f: v for f, v in one.computed.items() if f != "computed_reprefill_calls"}
            if not (batch_rows and k > 1):
                assert got.computed["computed_reprefill_calls"] == one.computed["computed_reprefill_calls"]


def test_fused_hold_call_counts_by_hand(runner, monkeypatch):
    """Hold at M = 2 (slides at rows 29, 39, 49, 59 as ``test_hold_call_counts_by_hand``) with the slide row fused:
    every slide row's block rides in its re-prefill call (kept block + new block = 2 x 62 tokens per batch row), so
    the only other LLM calls are the boundary rows 9 and 19, before the first slide. Per 12 s stream: 2 + 4 calls at
    K = 1 (unfused: 6 + 4), 2 + 2 at K = 2 (unfused 6 + 2). K = 3: slides {2, 3, 4} (3 + 3 + 2 rows) in one call,
    slide 5 (the 12 s stream alone) in its own fused call."""
    calls = _count_calls(monkeypatch)
    streams = _streams()
    n = TOKENS_PER_BLOCK
    want_fused = {1: [(3, 2 * n), (3, 2 * n), (2, 2 * n), (1, 2 * n)], 2: [(6, 2 * n), (3, 2 * n)],
                  3: [(8, 2 * n), (1, 2 * n)]}
    want_calls = {1: [4, 2, 3], 2: [2, 1, 2], 3: [2, 1, 1]}
    for k in (1, 2, 3):
        calls["ahead"].clear()
        calls["forward"].clear()
        res = BatchedOmniRunner(runner, 8, reprefill_slides=k, fuse_slide_rows=True).run_streams(
            streams, COMPLETED_BLOCK_HOLD, memory_s=MEMORY_S, verify_rows=0)
        assert calls["ahead"] == []  # no keys/values-only re-prefill left
        assert calls["forward"] == [(3, n), (3, n)] + want_fused[k]
        assert [r.computed["computed_reprefill_calls"] for r in res] == want_calls[k]
        assert [r.computed["computed_llm_tokens"] for r in res] == [(6 + 4) * n, (4 + 2) * n, (5 + 3) * n]


def test_kept_layouts_that_differ_take_one_call_each(runner, monkeypatch):
    """A stream whose frames end at 7 s (its own group): slides 2-5 keep block 1 (2 patches), 2 (2 patches), 3 (one
    patch: frames 12, 13) and 4 (no frame). K = 4: slides 2 and 3 share a layout (one call), 4 and 5 get one
    call each; the states equal K = 1 and the one-session path."""
    calls = _count_calls(monkeypatch)
    f, a = media(12.0, 3)
    stream = [{"frames": f[:14], "audio": a}]
    ref = runner.run_stream(stream[0]["frames"], stream[0]["audio"], COMPLETED_BLOCK_HOLD, memory_s=MEMORY_S,
                            verify_rows=-1)
    got = BatchedOmniRunner(runner, 8, reprefill_slides=4).run_streams(stream, COMPLETED_BLOCK_HOLD,
                                                                       memory_s=MEMORY_S, verify_rows=-1)[0]
    assert calls["ahead"] == [(2, 62), (1, 56), (1, 50)]
    assert got.computed["computed_reprefill_calls"] == 3
    assert torch.allclose(got.states, ref.states, atol=1e-5, rtol=0) and got.verification["cache_replay"]["passed"]


def test_sliding_and_one_block_memory_do_not_reprefill(runner, monkeypatch):
    calls = _count_calls(monkeypatch)
    streams = _streams()[:2]
    for policy, memory_s in ((SLIDING, MEMORY_S), (WINDOW, 2.0)):  # 2 s memory: nothing is kept at a slide
        res = BatchedOmniRunner(runner, 8, reprefill_slides=3).run_streams(streams, MICRO_CHUNK_200MS,
                                                                           memory_s=memory_s, verify_rows=0,
                                                                           memory_policy=policy)
        assert [r.computed["computed_reprefill_calls"] for r in res] == [0, 0] and calls["ahead"] == []


def test_default_slides_from_the_memory_bound(runner):
    """Tiny thinker (fp32, 2 layers, 2 KV heads of 8, hidden 32, FFN 64): 4 * (2 * 2 * 2 * 8 + 4 * 32 + 3 * 64)
    = 1,536 bytes per token; the default takes as many slides as fit in ``reprefill_memory_bytes``."""
    per_token = reprefill_bytes_per_token(runner.text_config, runner.dtype)
    assert per_token == 1536
    one_slide = 3 * 100 * per_token  # 3 streams x (prompt + kept) = 100 tokens
    assert BatchedOmniRunner(runner)._slides_per_call(3, 100) == REPREFILL_SLIDES_MAX  # 16 GiB: the cap
    assert BatchedOmniRunner(runner, reprefill_memory_bytes=2 * one_slide + 1)._slides_per_call(3, 100) == 2
    assert BatchedOmniRunner(runner, reprefill_memory_bytes=one_slide - 1)._slides_per_call(3, 100) == 1
    assert BatchedOmniRunner(runner, reprefill_slides=7)._slides_per_call(3, 100) == 7
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="reprefill_slides"):
            BatchedOmniRunner(runner, reprefill_slides=bad)


def test_bench_reprefill_slides_side_by_side(tmp_path):
    """``bench/extract_throughput.py --reprefill-slides 1 3``: one window row per K (labelled), the same states
    and tokens, fewer re-prefill calls at K = 3; bad values are refused."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--tiny", "--sessions", "2", "--duration", "10", "--memory", "4", "--modes",
                       COMPLETED_BLOCK_HOLD, "--memory-policy", WINDOW, "--reprefill-slides", "1", "3"])
    one, three = rows[1:]
    assert (one["path"], three["path"]) == ("batched 2 + reuse, K=1", "batched 2 + reuse, K=3")
    assert (one["reprefill_slides"], three["reprefill_slides"]) == (1, 3)
    # 10 s and 7.6 s (38 rows) sessions: hold slides at the boundary rows 29, 39, 49 and at row 29 only (row 39 is
    # past its end): K = 1: 3 + 1 calls, K = 3: 1 + 1
    assert (one["reprefill_calls"], three["reprefill_calls"]) == (4, 2)
    assert one["max_abs_diff"] == three["max_abs_diff"] == 0.0 and one["llm_tokens_per_s"] == three["llm_tokens_per_s"]
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--reprefill-slides", "0"])


def test_bench_fused_against_unfused(tmp_path, capsys):
    """``bench/extract_throughput.py --fuse-slide-rows``: each window row runs unfused, then fused, and the
    comparison table pairs them. Hold at M = 2, 10 s and 7.6 s (38 rows) sessions, K = 2: unfused, the payload calls
    of rows 9, 19, 29 (both sessions), 39 and 49 (10 s only) + one re-prefill call for slides 1, 2 + one for slide 3
    (alone: the one-slide path) = 7 LLM calls; fused, rows 9 and 19 + the same two re-prefill calls = 4."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "bench" / "extract_throughput.py"
    spec = importlib.util.spec_from_file_location("extract_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--tiny", "--sessions", "2", "--duration", "10", "--memory", "4", "--modes",
                       COMPLETED_BLOCK_HOLD, "--memory-policy", WINDOW, "--reprefill-slides", "2",
                       "--fuse-slide-rows"])
    plain, fused = rows[1:]
    assert (plain["path"], fused["path"]) == ("batched 2 + reuse, K=2", "batched 2 + reuse, K=2, fused")
    assert (plain["llm_calls"], fused["llm_calls"]) == (7, 4)
    assert plain["reprefill_calls"] == fused["reprefill_calls"] == 3
    assert plain["llm_tokens_per_s"] == fused["llm_tokens_per_s"] and plain["vs_unfused"] is None
    assert fused["vs_unfused"] <= 1e-5 and fused["max_abs_diff"] <= 1e-5
    table = capsys.readouterr().out.split("slide row fused into the re-prefill call")[1]
    assert "| completed-block-hold | batched 2 + reuse, K=2 | 2 |" in table and "| 7 -> 4 |" in table


def test_extractor_setting(runner, tmp_path):
    """``model.init_args.reprefill_slides`` and ``fuse_slide_rows`` (off by default) reach the batched runner; a bad value is refused before the model
    loads."""
    from algorithms.errors import SettingError
    from lightning_modules.omni_extractor import OmniFeatureExtractor

    with pytest.raises(SettingError, match="model.init_args.reprefill_slides=0"):
        OmniFeatureExtractor(str(tmp_path / "no_model_here"), reprefill_slides=0)
    ext = OmniFeatureExtractor(runner.model_dir, sessions_per_batch=2, reprefill_slides=2)
    assert ext.batched.reprefill_slides == 2 and ext.batched.fuse_slide_rows is False
    assert OmniFeatureExtractor(runner.model_dir, sessions_per_batch=2, fuse_slide_rows=True).batched.fuse_slide_rows


def test_extract_sessions_fused_records(runner):
    """The feature records of a fused batched extraction (hold, 4 s memory: a 6.4 s and a 6 s stream, each sliding
    once, at row 29, in one call for both) equal the one-session records to 1e-5 and say ``fuse_slide_rows`` in their meta (absent when off)."""
    from lightning_modules.omni_extractor import extract_session, extract_sessions

    sessions = []
    for i, dur in enumerate((6.4, 6.0)):
        f, a = media(dur, 20 + i)
        sessions.append({"session": f"Session_{i}", "timeline_end_s": dur, "gap_policy": "reset",
                         "streams": [{"start_s": 0.0, "frames": torch.from_numpy(f), "audio": torch.from_numpy(a)}]})
    fused = BatchedOmniRunner(runner, 2, fuse_slide_rows=True)
    got = extract_sessions(runner, sessions, COMPLETED_BLOCK_HOLD, MEMORY_S, verify_rows=0, batched=fused)
    plain = extract_sessions(runner, sessions, COMPLETED_BLOCK_HOLD, MEMORY_S, verify_rows=0, sessions_per_batch=2)
    for s, rec, off in zip(sessions, got, plain):
        ref = extract_session(runner, s, COMPLETED_BLOCK_HOLD, MEMORY_S, verify_rows=0)
        assert all(torch.allclose(rec["tensors"][k].float(), ref["tensors"][k].float(), atol=1e-5, rtol=0)
                   for k in ref["tensors"])
        assert rec["meta"]["fuse_slide_rows"] is True and "fuse_slide_rows" not in off["meta"]
        assert rec["meta"]["computed_reprefill_calls"] == 1

