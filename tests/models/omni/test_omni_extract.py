"""Causal omni features on a tiny random Qwen2.5-Omni thinker (fp32, CPU): accounting, causality, cache replay,
memory, hold initialization, TMRoPE vs the library, feature files and the shipped extract configs; the ``sliding``
memory policy (cache replay against an independent 4-D-mask reference, agreement with ``window`` before the first
slide, the 4 s table, feature-file metadata and the training side's fail-closed check)."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from algorithms.streaming import (COMPLETED_BLOCK_HOLD, MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY, SLIDING, WINDOW,
                                  accounting)
from datamodules.features import FeatureFileError, check_meta, feature_path, load_features, save_features
from lightning_modules.omni_extractor import OmniFeatureExtractor, extract_session
from models.omni.thinker import OmniThinkerRunner
from models.omni.tiny import build_tiny_omni

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs" / "extract").glob("*.yaml"))
TABLE_4S = {OPEN_STREAM_REPLAY: (20, 22.0), COMPLETED_BLOCK_HOLD: (2, 4.0), MICRO_CHUNK_200MS: (20, 4.0)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_omni(tmp_path_factory.mktemp("tiny_omni"))


@pytest.fixture(scope="module")
def runner(model_dir):
    return OmniThinkerRunner(model_dir, layer=-1)


def media(seconds, seed=0):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (int(seconds * 2), 56, 84, 3), dtype=np.uint8)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    return frames, audio


def perturb_after(frames, audio, t_s, seed=1):
    """New media differing from the original only after t_s (frames whose right edge is later, audio after t_s)."""
    rng = np.random.default_rng(seed)
    f, a = frames.copy(), audio.copy()
    k0 = int(t_s * 2 + 1e-9)  # frames k >= k0 end after t_s
    f[k0:] = rng.integers(0, 256, f[k0:].shape, dtype=np.uint8)
    a[int(round(t_s * 16000)):] = (0.1 * rng.standard_normal(len(a) - int(round(t_s * 16000)))).astype(np.float32)
    return f, a


@pytest.fixture(scope="module")
def four_s(runner):
    frames, audio = media(4.0)
    return frames, audio, {m: runner.run_stream(frames, audio, m, verify_rows=-1) for m in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_four_second_table_and_shape(four_s, runner, mode):
    res = four_s[2][mode]
    assert res.states.shape == (20, runner.hidden_size)
    assert (res.processor_calls, res.prepared_media_s) == TABLE_4S[mode]
    a = accounting(res.steps)
    every = list(range(20))
    expected = {OPEN_STREAM_REPLAY: (every, [9, 19]), COMPLETED_BLOCK_HOLD: ([9, 19], [9, 19]),
                MICRO_CHUNK_200MS: (every, every)}[mode]
    assert (a.state_update_rows, a.payload_commit_rows, a.native_boundary_rows) == (*expected, [9, 19])


@pytest.mark.parametrize("mode", MODES)
def test_cache_replay_exact(four_s, mode):
    v = four_s[2][mode].verification["cache_replay"]
    assert v["passed"] and v["max_abs_diff"] <= 1e-5
    assert len(v["rows"]) == (2 if mode == COMPLETED_BLOCK_HOLD else 20)


def test_cache_replay_across_evictions(runner):
    frames, audio = media(6.0, seed=3)
    for mode in MODES:  # 2 s memory: the window slides at every block, the kept blocks are re-prefilled
        v = runner.run_stream(frames, audio, mode, memory_s=2.0, verify_rows=-1).verification["cache_replay"]
        assert v["passed"], (mode, v["max_abs_diff"])


def test_window_cache_replay_can_fail(four_s, runner, monkeypatch):
    """The window-policy ``cache_replay`` check is not vacuous: with the step that drops open-stream-replay's partial
    tails disabled (``_truncate``; no window slide in 4 s at 8 s memory), later rows attend to stale tails that a
    from-scratch prefill of the window does not have, and the check reports the failure."""
    frames, audio, base = four_s
    monkeypatch.setattr(OmniThinkerRunner, "_truncate", staticmethod(lambda cache, length: None))
    res = runner.run_stream(frames, audio, OPEN_STREAM_REPLAY, verify_rows=-1)
    v = res.verification["cache_replay"]
    assert v["rows"] == list(range(20))
    assert not v["passed"] and v["max_abs_diff"] > 1e-3, v["max_abs_diff"]
    assert torch.equal(res.states[0], base[OPEN_STREAM_REPLAY].states[0])   # row 0: no stale tail yet
    assert not torch.equal(res.states[1], base[OPEN_STREAM_REPLAY].states[1])


@pytest.mark.parametrize("mode", MODES)
def test_four_second_table_sliding(four_s, runner, mode):
    """DESIGN §5's 4 s table holds under ``sliding`` too (no slide in 4 s at 8 s memory: same states as window)."""
    frames, audio, base = four_s
    res = runner.run_stream(frames, audio, mode, verify_rows=2, memory_policy=SLIDING)
    assert (res.processor_calls, res.prepared_media_s) == TABLE_4S[mode]
    assert accounting(res.steps) == accounting(base[mode].steps)
    assert torch.equal(res.states, base[mode].states) and res.verification["cache_replay"]["passed"]


def test_sliding_cache_replay_across_evictions_and_can_fail(runner, monkeypatch):
    """10 s at 2 s memory: evictions at every block; rows of blocks 0-2 (< 3 M) are checked against one forward over
    the whole payload history under the policy's 4-D mask, i.e. across the first two evictions. With the eviction
    disabled the check fails."""
    frames, audio = media(10.0, seed=3)
    for mode in MODES:
        res = runner.run_stream(frames, audio, mode, memory_s=2.0, verify_rows=-1, memory_policy=SLIDING)
        v = res.verification["cache_replay"]
        assert v["passed"] and v["max_abs_diff"] <= 1e-5, (mode, v["max_abs_diff"])
        assert max(res.steps[r].block for r in v["rows"]) == 2 and "< 3 M" in v["what"]
        assert len(v["rows"]) == (3 if mode == COMPLETED_BLOCK_HOLD else 30)
    monkeypatch.setattr(OmniThinkerRunner, "_evict_rows", staticmethod(lambda cache, start, length: None))
    for mode in MODES:
        v = runner.run_stream(frames, audio, mode, memory_s=2.0, verify_rows=2,
                              memory_policy=SLIDING).verification["cache_replay"]
        assert not v["passed"] and v["max_abs_diff"] > 1e-3, (mode, v["max_abs_diff"])


@pytest.mark.parametrize("mode", MODES)
def test_window_and_sliding_agree_until_the_first_slide(runner, mode):
    frames, audio = media(6.0, seed=4)
    w = runner.run_stream(frames, audio, mode, memory_s=4.0, verify_rows=0)
    s = runner.run_stream(frames, audio, mode, memory_s=4.0, verify_rows=0, memory_policy=SLIDING)
    slide = 20  # block 2 = M: the first row whose window starts after block 0
    assert torch.equal(w.states[:slide], s.states[:slide])
    later = [st.row for st in w.steps if st.update and st.row >= slide]
    assert later and all(not torch.equal(w.states[r], s.states[r]) for r in later)


def test_unknown_memory_policy_is_refused(runner, model_dir):
    frames, audio = media(2.0)
    for call in (lambda: runner.run_stream(frames, audio, OPEN_STREAM_REPLAY, memory_policy="exact"),
                 lambda: extract_session(runner, _session(2.0), OPEN_STREAM_REPLAY, 8.0, memory_policy="exact"),
                 lambda: OmniFeatureExtractor(str(model_dir), memory_policy="exact")):
        with pytest.raises(ValueError, match=r"unknown memory_policy 'exact'; expected one of \('window', 'sliding'\)"):
            call()


@pytest.mark.parametrize("mode", MODES)
def test_causality(four_s, runner, mode):
    frames, audio, base = four_s
    i = 12  # t_i = 2.6 s
    f2, a2 = perturb_after(frames, audio, 0.2 * (i + 1))
    res = runner.run_stream(f2, a2, mode, verify_rows=0)
    assert torch.equal(res.states[: i + 1], base[mode].states[: i + 1])
    assert not torch.equal(res.states[19], base[mode].states[19])  # the change is visible later


@pytest.mark.parametrize("mode", MODES)
def test_memory_window(runner, mode):
    frames, audio = media(8.0, seed=5)
    base = runner.run_stream(frames, audio, mode, memory_s=2.0, verify_rows=0)
    f2, a2 = frames.copy(), audio.copy()
    f2[:8] = 255 - f2[:8]  # media of the first 4 s altered
    a2[: 4 * 16000] = -a2[: 4 * 16000] + 0.05
    alt = runner.run_stream(f2, a2, mode, memory_s=2.0, verify_rows=0)
    late = 35 if mode != COMPLETED_BLOCK_HOLD else 39  # t = 7.2 s (window [6, 7.2]) / 8.0 s (window [6, 8])
    assert torch.equal(alt.states[late], base.states[late])
    assert not torch.equal(alt.states[9], base.states[9])
    long_memory = runner.run_stream(f2, a2, mode, memory_s=8.0, verify_rows=0)
    assert not torch.equal(long_memory.states[late], base.states[late]) or mode == COMPLETED_BLOCK_HOLD


def test_hold_first_nine_rows_zero_and_flagged(four_s):
    from algorithms.streaming import masks

    res = four_s[2][COMPLETED_BLOCK_HOLD]
    m = masks(res.steps)
    assert torch.count_nonzero(res.states[:9]) == 0 and m["initialization_mask"][:9] == [1] * 9
    assert m["initialization_mask"][9] == 0 and torch.count_nonzero(res.states[9]) > 0
    assert torch.equal(res.states[10], res.states[9]) and torch.equal(res.states[18], res.states[9])


def test_micro_chunk_refuses_when_not_tiling(runner):
    frames, audio = media(2.0)
    good = runner.geometry
    try:
        runner.geometry = dataclasses.replace(good, positions_per_s=24)
        with pytest.raises(ValueError, match="refuses to run.*10 micro steps must tile"):
            runner.run_stream(frames, audio, MICRO_CHUNK_200MS)
    finally:
        runner.geometry = good


def test_micro_chunk_diagnostic_is_reported(four_s):
    """The diagnostic compares the micro-chunk state at the block boundaries (rows 9, 19) with the native-block
    prefill of the same window (DESIGN §5, ``_verify``). With 8 s memory that reference is exactly what
    ``completed-block-hold`` computes at those rows (its payloads are the native blocks [0, 2) s and [2, 4) s, its
    cache replay is exact), so the reported cosine / max-abs-diff equal the ones taken against the hold states."""
    frames, audio, res = four_s
    hold, micro = res[COMPLETED_BLOCK_HOLD], res[MICRO_CHUNK_200MS]
    assert hold.verification["cache_replay"]["max_abs_diff"] <= 1e-5       # hold == from-scratch native prefill
    d = micro.verification["micro_chunk_vs_continuous_semantics"]
    assert d["applicable"] and d["rows"] == [9, 19]
    cos = [float(torch.nn.functional.cosine_similarity(hold.states[r].double(), micro.states[r].double(), dim=0))
           for r in (9, 19)]
    mad = [float((hold.states[r] - micro.states[r]).abs().max()) for r in (9, 19)]
    assert d["cosine"] == pytest.approx(cos, abs=1e-4)
    assert d["max_abs_diff"] == pytest.approx(mad, abs=1e-4)
    assert d["mean_cosine"] == pytest.approx(sum(cos) / 2, abs=1e-4)
    assert max(mad) > 1e-3     # a diagnostic, not an equivalence: the micro-chunk states do differ


def test_tmrope_matches_library_on_complete_blocks(runner):
    """Incremental positions of prompt + 2 complete blocks == get_rope_index(use_audio_in_video=True)."""
    frames, audio = media(4.0, seed=7)
    cfg = runner.thinker.config
    payloads = [runner.embed(runner.prepare(frames, audio, a, a + 2000, count=False), a, a + 2000)
                for a in (0, 2000)]
    mine = torch.cat([runner.prompt_positions()] + [runner.payload_positions(p, 0) for p in payloads], 1)
    # the same content as the library lays it out: prompt (ends with vision_bos, audio_bos), one video of 8 frames
    # (4 temporal patches) with its 4 s of audio interleaved per 2 s chunk, then audio_eos, vision_eos
    full = runner.prepare(frames, audio, 0, 4000, count=False)
    n_video = int(full["video_grid_thw"].prod()) // 4
    n_audio = 100
    ids = runner.prompt_token_ids + [cfg.video_token_id] * n_video + [cfg.audio_token_id] * n_audio + \
        [cfg.audio_end_token_id, cfg.vision_end_token_id]
    ids_t = torch.tensor([ids])
    ref, _ = runner.thinker.model.get_rope_index(
        ids_t, video_grid_thw=full["video_grid_thw"], attention_mask=torch.ones_like(ids_t), use_audio_in_video=True,
        audio_seqlens=torch.tensor([400]), second_per_grids=torch.tensor([1.0]))
    ref = ref[:, 0, : mine.shape[1]]
    assert sorted(map(tuple, ref.T.tolist())) == sorted(map(tuple, mine.T.tolist()))
    assert torch.equal(ref, mine)


def test_audio_features_match_official_padding(runner):
    """Without left context (``audio_left_context=False``, the earlier behaviour) a payload's log-mel is the official
    extractor's on the payload's own samples; with it (default) only the first frames change (next test)."""
    _, audio = media(1.0, seed=9)
    chunk = audio[3200:9600]
    ref = runner.feature_extractor(chunk, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                                   return_tensors="pt")
    n = int(ref["attention_mask"].sum())
    runner.audio_left_context = False
    try:
        mine = runner.prepare(np.zeros((0, 56, 84, 3), np.uint8), audio, 200, 600, count=False)["input_features"]
    finally:
        runner.audio_left_context = True
    assert n == mine.shape[-1] == 40
    assert torch.allclose(ref["input_features"][..., :n], mine, atol=1e-5)
    with_ctx = runner.prepare(np.zeros((0, 56, 84, 3), np.uint8), audio, 200, 600, count=False)["input_features"]
    assert torch.equal(with_ctx[..., 2:], mine[..., 2:])   # frames 2.. never reach the payload's start padding
    assert not torch.allclose(with_ctx[..., :2], mine[..., :2], atol=1e-3)


def test_block_log_mel_equals_whole_clip_log_mel(runner):
    """Each 2 s block's log-mel against transformers' own whole-clip log-mel of the same 4 s (``WhisperFeatureExtractor``
    as the Qwen2.5-Omni processor calls it, padded to its 30 s). Block 1's frames 200-201 are centred at 2.00 and
    2.01 s: their STFT windows reach 200 / 40 samples before the block, which the left context supplies (causal), so
    they equal the whole-clip frames; the payload's own reflect padding (``audio_left_context=False``) does not. Frame
    199 (block 0's last) reaches 40 samples past 2 s (future audio): it must differ. Noise audio keeps every value above
    both maxima - 8, so the per-payload floor (the clip-wide maximum needs the future) does not enter here."""
    _, audio = media(4.0, seed=3)
    whole = runner.feature_extractor(audio[:64000], sampling_rate=16000, return_tensors="pt")["input_features"][..., :400]
    none = np.zeros((0, 56, 84, 3), np.uint8)
    blocks = [runner.prepare(none, audio, a, a + 2000, count=False)["input_features"] for a in (0, 2000)]
    assert blocks[0].shape == blocks[1].shape == (1, 128, 200)
    # the floor clamps log10 at its max - 8, i.e. a feature at its max - 2: no value is near either floor
    assert all(float(b.min()) > float(b.max()) - 2.0 for b in blocks + [whole])
    assert torch.allclose(blocks[1], whole[..., 200:], atol=1e-5)          # the whole block, 200-201 included
    assert torch.equal(blocks[1][..., :2], whole[..., 200:202])  # exactly: same samples, same operations
    assert torch.allclose(blocks[0][..., :199], whole[..., :199], atol=1e-5)
    assert float((blocks[0][..., 199] - whole[..., 199]).abs().max()) > 1e-2  # needs 40 future samples
    runner.audio_left_context = False
    try:
        old = runner.prepare(none, audio, 2000, 4000, count=False)["input_features"]
    finally:
        runner.audio_left_context = True
    assert float((old[..., :2] - whole[..., 200:202]).abs().max()) > 1e-2
    assert torch.allclose(old[..., 2:], whole[..., 202:], atol=1e-5)


def _session(seconds=4.0):
    frames, audio = media(seconds)
    return {"session": "Session_9", "timeline_end_s": seconds, "gap_policy": "reset",
            "streams": [{"start_s": 0.0, "frames": torch.from_numpy(frames), "audio": torch.from_numpy(audio)}]}


def test_feature_file_roundtrip_and_wrong_mode_fails(runner, tmp_path):
    rec = extract_session(runner, _session(), COMPLETED_BLOCK_HOLD, 8.0, verify_rows=2)
    path = save_features(feature_path(tmp_path, rec["session"], rec["mode"]), rec["tensors"], rec["meta"])
    assert path.name == "Session_9.completed-block-hold.safetensors"
    tensors, meta = load_features(path)
    assert tensors["states"].shape == (20, runner.hidden_size)
    assert meta["production_processor_calls"] == 2 and meta["production_prepared_media_seconds"] == 4.0
    assert meta["peak_memory_kind"] == "process_max_rss" and meta["peak_memory_bytes"] > 0   # CPU: the process peak
    assert meta["verification"]["cache_replay"]["passed"]
    assert tensors["initialization_mask"][:9].tolist() == [1] * 9
    # DESIGN §5, completed-block-hold over 4 s: only the completed blocks [0, 2) and [2, 4) s are processed, at rows
    # 9 (t = 2.0 s) and 19 (t = 4.0 s); rows 10-18 hold row 9's state (newest media seen ends at 2.0 s); rows 0-8
    # have no state yet
    assert tensors["initialization_mask"].tolist() == [1] * 9 + [0] * 11
    assert tensors["state_update_mask"].tolist() == [0] * 9 + [1] + [0] * 9 + [1]
    assert tensors["payload_commit_mask"].nonzero().flatten().tolist() == [9, 19]
    assert tensors["native_boundary_mask"].nonzero().flatten().tolist() == [9, 19]
    assert tensors["state_source_times"].tolist() == pytest.approx([-1.0] * 9 + [2.0] * 10 + [4.0], abs=1e-6)
    assert tensors["row_times"].tolist() == pytest.approx([0.2 * (i + 1) for i in range(20)], abs=1e-6)
    check_meta(path, meta, {"mode": COMPLETED_BLOCK_HOLD, "memory_s": 8.0, "fps": 2.0, "layer": runner.layer})
    with pytest.raises(FeatureFileError, match="mode: expected 'open-stream-replay'"):
        check_meta(path, meta, {"mode": OPEN_STREAM_REPLAY, "memory_s": 8.0})
    with pytest.raises(FeatureFileError, match="memory_s"):
        check_meta(path, meta, {"mode": COMPLETED_BLOCK_HOLD, "memory_s": 4.0})
    assert meta["memory_policy"] == WINDOW


def test_feature_files_carry_memory_policy_and_training_fails_closed(runner, tmp_path):
    from datamodules.synthetic_turns import write_synthetic_dataset
    from datamodules.turn_features import TurnFeatureDataModule

    rec = extract_session(runner, _session(2.0), OPEN_STREAM_REPLAY, 2.0, verify_rows=1, memory_policy=SLIDING)
    win = extract_session(runner, _session(2.0), OPEN_STREAM_REPLAY, 2.0, verify_rows=0)
    assert (rec["meta"]["memory_policy"], win["meta"]["memory_policy"]) == (SLIDING, WINDOW)
    n_layers = runner.text_config.num_hidden_layers   # layer -1 is recorded resolved, with the depth beside it
    assert (rec["meta"]["layer"], rec["meta"]["num_layers"]) == (runner.layer, n_layers) and runner.layer == n_layers
    assert rec["meta"]["config_hash"] != win["meta"]["config_hash"]
    assert rec["meta"]["verification"]["cache_replay"]["passed"]
    # training side: files without the field (the synthetic writer, older extractions) count as window
    demo = write_synthetic_dataset(tmp_path / "demo", num_sessions=3, duration_s=10.0, dim=8,
                                   modes=(OPEN_STREAM_REPLAY,))
    kw = dict(features_dir=str(demo / "features"), expected_mode=OPEN_STREAM_REPLAY,
              utterances_root=str(demo / "transcripts"),
              utterances_loader="datamodules.turn_features.load_utterances_json",
              train_sessions=[1], val_sessions=[2], test_sessions=[3])
    assert TurnFeatureDataModule(**kw).load()["train"][0].states.shape[1] == 8
    with pytest.raises(FeatureFileError, match=r"no feature files for expected_mode='open-stream-replay', "
                                               r"expected_memory_policy='sliding'"):
        TurnFeatureDataModule(expected_memory_policy=SLIDING, **kw).load()
    # a sliding-named file whose metadata says window (renamed by hand) fails closed, naming the file
    import shutil

    for n in (1, 2, 3):
        src = feature_path(demo / "features", f"Session_{n}", OPEN_STREAM_REPLAY)
        shutil.copy(src, feature_path(demo / "features", f"Session_{n}", OPEN_STREAM_REPLAY, SLIDING))
    with pytest.raises(FeatureFileError, match=r"Session_1\.open-stream-replay\.sliding\.safetensors.*"
                                               r"memory_policy: expected 'sliding', file has 'window'"):
        TurnFeatureDataModule(expected_memory_policy=SLIDING, **kw).load()
    path = feature_path(demo / "features", "Session_2", OPEN_STREAM_REPLAY)
    tensors, meta = load_features(path)
    save_features(path, tensors, {**meta, "memory_policy": rec["meta"]["memory_policy"]})
    with pytest.raises(FeatureFileError, match=r"Session_2\.open-stream-replay\.safetensors.*"
                                               r"memory_policy: expected 'window', file has 'sliding'"):
        TurnFeatureDataModule(**kw).load()
    with pytest.raises(ValueError, match="unknown expected_memory_policy .exact."):
        TurnFeatureDataModule(expected_memory_policy="exact", **kw)


def test_session_grid_with_reset_gap(runner):
    s = _session(2.0)
    frames, audio = media(2.0, seed=11)
    s["streams"].append({"start_s": 3.0, "frames": torch.from_numpy(frames), "audio": torch.from_numpy(audio)})
    s["timeline_end_s"] = 5.0
    rec = extract_session(runner, s, OPEN_STREAM_REPLAY, 8.0, verify_rows=1)
    t = rec["tensors"]
    assert t["states"].shape[0] == 25
    assert t["initialization_mask"].tolist() == [0] * 10 + [1] * 5 + [0] * 10
    assert t["native_boundary_mask"].nonzero().flatten().tolist() == [9, 24]
    assert float(t["state_source_times"][15]) == pytest.approx(3.2)
    # DESIGN §5, open-stream-replay, per stream (stream 0 on rows 0-9, stream 1 from 3.0 s on rows 15-24, gap rows
    # 10-14 covered by no stream): every row of a stream is updated, commits at its block ends (stream row 9 = grid
    # rows 9 and 15 + 9 = 24); a row's newest media ends at its own right edge, on the session timeline
    assert t["state_update_mask"].tolist() == [1] * 10 + [0] * 5 + [1] * 10
    assert t["payload_commit_mask"].nonzero().flatten().tolist() == [9, 24]
    src = [0.2 * (i + 1) for i in range(10)] + [-1.0] * 5 + [3.0 + 0.2 * (i + 1) for i in range(10)]
    assert src[:2] == pytest.approx([0.2, 0.4]) and src[-1] == pytest.approx(5.0)
    assert t["state_source_times"].tolist() == pytest.approx(src, abs=1e-5)
    assert t["row_times"].tolist() == pytest.approx([0.2 * (i + 1) for i in range(25)], abs=1e-5)
    assert rec["meta"]["production_processor_calls"] == 20


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_shipped_extract_configs_instantiate(config, model_dir, tmp_path):
    from evaluate import cli_main

    import yaml

    first = config.read_text().splitlines()[0]
    assert first == f"# python evaluate.py predict --config configs/extract/{config.name}"
    cfg = yaml.safe_load(config.read_text())
    assert cfg.pop("return_predictions") is False  # a predict-subcommand key; run=False has no subcommand
    plain = tmp_path / config.name
    plain.write_text(yaml.safe_dump(cfg))
    cli = cli_main(["--config", str(plain), "--model.init_args.model_dir", str(model_dir),
                    "--data.init_args.root", str(tmp_path)], run=False)
    assert cli.model.hparams.mode == config.stem.replace("_", "-")
    assert cfg["model"]["init_args"]["memory_policy"] == cli.model.hparams.memory_policy == WINDOW
    assert type(cli.datamodule).__name__ == "EasyComStreamDataModule"
    # sessions run in lockstep as shipped: the model and the data agree on the batch of sessions
    assert cli.model.batched.sessions_per_batch == cli.datamodule.hparams.sessions_per_batch == 8


def test_predict_end_to_end(model_dir, tmp_path):
    from callbacks.feature_writer import plot_session_timeline
    from datamodules.easycom_fixture import build_easycom_fixture
    from evaluate import cli_main

    root = build_easycom_fixture(tmp_path / "ec", width=160, height=90,
                                 sessions={"Session_1": [("00-00-000", "cockatoo.mp4", 0.0, 4.0, "realshort.mp4")]})
    out = tmp_path / "feats"
    for cfg in ("completed_block_hold", "micro_chunk_200ms"):
        cli_main(["predict", "--config", str(CONFIGS[0].parent / f"{cfg}.yaml"), "--model.init_args.model_dir",
                  str(model_dir), "--data.init_args.root", str(root), "--data.init_args.num_workers", "0",
                  "--data.init_args.frame_height", "56", "--data.init_args.frame_width", "96",
                  "--trainer.callbacks.init_args.out_dir", str(out)])
    tensors, meta = load_features(out / "Session_1.micro-chunk-200ms.safetensors")
    assert tensors["states"].shape[0] == 19 and meta["session"] == "Session_1"  # 3.95 s of video -> 19 rows
    assert (out / "Session_1.timeline.png").stat().st_size > 0
    assert plot_session_timeline(out, "Session_1", tmp_path / "t.png").is_file()


def test_predict_batched_sessions_write_the_same_files(model_dir, tmp_path):
    """``sessions_per_batch: 2`` on the datamodule and the extractor (lockstep path, issue 12) writes the same
    states and masks as one session at a time."""
    import torch

    from datamodules.easycom_fixture import build_easycom_fixture
    from evaluate import cli_main

    clip = [("00-00-000", "cockatoo.mp4", 0.0, 3.0, "realshort.mp4")]
    root = build_easycom_fixture(tmp_path / "ec", width=160, height=90,
                                 sessions={"Session_1": clip, "Session_2": clip, "Session_3": clip})
    outs = {}
    for n in (1, 2):
        out = tmp_path / f"feats{n}"
        cli_main(["predict", "--config", str(CONFIGS[0].parent / "completed_block_hold.yaml"),
                  "--model.init_args.model_dir", str(model_dir), "--model.init_args.sessions_per_batch", str(n),
                  "--data.init_args.sessions_per_batch", str(n), "--data.init_args.root", str(root),
                  "--data.init_args.num_workers", "0", "--data.init_args.frame_height", "56",
                  "--data.init_args.frame_width", "96", "--trainer.callbacks.init_args.out_dir", str(out)])
        outs[n] = out
    for s in ("Session_1", "Session_2", "Session_3"):
        a, meta_a = load_features(outs[1] / f"{s}.completed-block-hold.safetensors")
        b, meta_b = load_features(outs[2] / f"{s}.completed-block-hold.safetensors")
        assert set(a) == set(b) and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-5) for k in a)
        assert meta_b["sessions_per_batch"] == 2 and "computed_processor_calls" in meta_b


def test_feature_writer_keeps_policies_apart(runner, tmp_path):
    """A sliding extraction written into the folder of a window one adds files; it never overwrites them."""
    from callbacks.feature_writer import FeatureWriter
    from datamodules.features import parse_feature_name

    win = extract_session(runner, _session(2.0), OPEN_STREAM_REPLAY, 2.0, verify_rows=0)
    sld = extract_session(runner, _session(2.0), OPEN_STREAM_REPLAY, 2.0, verify_rows=0, memory_policy=SLIDING)
    writer = FeatureWriter(out_dir=str(tmp_path), plot=True)
    writer.write_on_batch_end(None, None, [win, sld], None, None, 0, 0)
    names = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert names == [f"{win['session']}.open-stream-replay.safetensors",
                     f"{win['session']}.open-stream-replay.sliding.safetensors"]
    assert [parse_feature_name(n)[1:] for n in names] == [(OPEN_STREAM_REPLAY, WINDOW), (OPEN_STREAM_REPLAY, SLIDING)]
    assert load_features(tmp_path / names[1])[1]["memory_policy"] == SLIDING
    import os
    umask = os.umask(0)
    os.umask(umask)
    assert all((tmp_path / n).stat().st_mode & 0o777 == 0o666 & ~umask for n in names)  # not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"{win['session']}.sliding.timeline.png",
                                                              f"{win['session']}.timeline.png"]


def test_bad_media_is_recorded_and_the_extraction_goes_on(model_dir, tmp_path, capsys):
    """One corrupt mp4, one truncated wav and one scrambled mp4 in a 4-session run (8 sessions per lockstep batch, as
    shipped): the healthy session is written; each bad one gets ``<session>.<mode>.error.json`` naming its file and
    the summary lists it; nothing already written is touched; once the files are repaired a re-run writes their
    features and removes the error files."""
    import json
    import shutil

    from datamodules.easycom_fixture import build_easycom_fixture
    from evaluate import cli_main

    clip = [("00-00-000", "cockatoo.mp4", 0.0, 3.0, "realshort.mp4")]
    root = build_easycom_fixture(tmp_path / "ec", width=160, height=90,
                                 sessions={f"Session_{n}": clip for n in (1, 2, 3, 4)})
    mp4 = root / "Main/Video_Compressed/Session_2/00-00-000.mp4"
    wav = root / "Main/Glasses_Microphone_Array_Audio/Session_3/00-00-000.wav"
    mp4b = root / "Main/Video_Compressed/Session_4/00-00-000.mp4"
    backup = tmp_path / "backup"
    backup.mkdir()
    for i, f in enumerate((mp4, wav, mp4b)):
        shutil.copy(f, backup / f"{i}")
    mp4.write_bytes(mp4.read_bytes()[:2000])                         # truncated video
    wav.write_bytes(wav.read_bytes()[: wav.stat().st_size // 2])     # truncated audio (header declares more)
    raw = bytearray(mp4b.read_bytes())                               # packets scrambled after the header
    rng = np.random.default_rng(0)
    raw[len(raw) // 3:] = rng.integers(0, 256, len(raw) - len(raw) // 3, dtype=np.uint8).tobytes()
    mp4b.write_bytes(bytes(raw))
    out = tmp_path / "feats"
    args = ["predict", "--config", str(CONFIGS[0].parent / "completed_block_hold.yaml"),
            "--model.init_args.model_dir", str(model_dir), "--data.init_args.root", str(root),
            "--data.init_args.num_workers", "0", "--data.init_args.frame_height", "56",
            "--data.init_args.frame_width", "96", "--trainer.callbacks.init_args.out_dir", str(out)]
    cli = cli_main(args)
    printed = capsys.readouterr().out
    writer = next(c for c in cli.trainer.callbacks if type(c).__name__ == "FeatureWriter")
    assert [r["session"] for r in writer.kept][:1] == ["Session_1"] and not any("tensors" in r for r in writer.kept)
    good = out / "Session_1.completed-block-hold.safetensors"
    assert good.is_file() and not (out / "Session_1.completed-block-hold.error.json").exists()
    errors = {n: json.loads((out / f"Session_{n}.completed-block-hold.error.json").read_text()) for n in (2, 3)}
    from datamodules.features import SHARED_FILE_MODE

    assert (out / "Session_2.completed-block-hold.error.json").stat().st_mode & 0o777 == SHARED_FILE_MODE
    assert str(mp4) in errors[2]["error"] and str(wav) in errors[3]["error"] and "truncated" in errors[3]["error"]
    assert errors[2]["mode"] == "completed-block-hold" and errors[2]["memory_policy"] == "window"
    four = out / "Session_4.completed-block-hold"
    if (out / "Session_4.completed-block-hold.error.json").exists():  # scrambled packets: FFmpeg may conceal them
        assert str(mp4b) in json.loads(Path(f"{four}.error.json").read_text())["error"]
    else:
        assert Path(f"{four}.safetensors").is_file()
    assert "wrote" in printed and "session(s) FAILED" in printed and "Session_2: " in printed
    assert not list(out.glob("Session_[23].completed-block-hold.safetensors"))
    before = good.stat().st_mtime_ns
    for i, f in enumerate((mp4, wav, mp4b)):                          # repaired: a re-run retries them
        shutil.copy(backup / f"{i}", f)
    keep = args + ["--trainer.callbacks.init_args.overwrite", "false"]
    cli_main(keep)
    assert good.stat().st_mtime_ns == before                         # kept (overwrite=False)
    assert all((out / f"Session_{n}.completed-block-hold.safetensors").is_file() for n in (2, 3, 4))
    assert not list(out.glob("*.error.json"))
    assert "already there, kept (overwrite=False)" in capsys.readouterr().out
    # Session_1's media goes bad after its features were written: the features stay, the failure is recorded beside
    # them, and once the media is fixed a run that keeps existing files (overwrite=False) clears the stale record
    one = root / "Main/Video_Compressed/Session_1/00-00-000.mp4"
    shutil.copy(one, backup / "one")
    one.write_bytes(b"")
    cli_main(keep)
    stale = out / "Session_1.completed-block-hold.error.json"
    assert stale.is_file() and good.stat().st_mtime_ns == before
    shutil.copy(backup / "one", one)
    cli_main(keep)
    assert not stale.exists() and good.stat().st_mtime_ns == before


def test_easycom_reader_names_bad_files_and_settings(tmp_path):
    """The reader's messages name the file: a truncated wav (data chunk longer than the file), a cut fmt chunk, an
    unreadable video, a missing session folder; a wav without its video is left out with a warning naming it; the
    datamodule refuses a sessions_per_batch or num_workers out of range."""
    import shutil

    from algorithms.errors import SettingError
    from datamodules.easycom import (EasyComFormatError, EasyComSessionStreams, EasyComStreamDataModule,
                                     _wav_layout, list_segments, video_info)
    from datamodules.easycom_fixture import build_easycom_fixture

    clip = [("00-00-000", "cockatoo.mp4", 0.0, 2.0, "realshort.mp4")]
    root = build_easycom_fixture(tmp_path / "ec", width=96, height=56, sessions={"Session_1": clip})
    wav = root / "Main/Glasses_Microphone_Array_Audio/Session_1/00-00-000.wav"
    cut = tmp_path / "cut.wav"
    cut.write_bytes(wav.read_bytes()[:1000])
    with pytest.raises(EasyComFormatError, match=f"{cut}: truncated: the data chunk declares"):
        _wav_layout(cut)
    cut.write_bytes(wav.read_bytes()[:30])
    with pytest.raises(EasyComFormatError, match=f"{cut}: truncated fmt chunk"):
        _wav_layout(cut)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\0" * 100)
    with pytest.raises(EasyComFormatError, match=f"{bad}: cannot open the video"):
        video_info(bad)
    with pytest.raises(EasyComFormatError, match="Session_7: session folder missing"):
        list_segments(root, "Session_7")
    shutil.copy(wav, wav.parent / "00-05-000.wav")
    assert [s.name for s in list_segments(root, "Session_1")] == ["00-00-000"]   # the wav is named in a log line
    with pytest.raises(EasyComFormatError, match=r"no folder for sessions \['Session_7'\]"):   # a typo: fail fast
        EasyComSessionStreams(root, ["Session_1", "Session_7"])
    import struct

    head = bytearray(wav.read_bytes())
    fmt = head.index(b"fmt ") + 8
    zero = tmp_path / "zero_channels.wav"
    zero.write_bytes(bytes(head[:fmt + 2]) + struct.pack("<H", 0) + bytes(head[fmt + 4:]))
    with pytest.raises(EasyComFormatError, match=f"{zero}: invalid fmt chunk \\(0 channels"):
        _wav_layout(zero)
    sr, nch, width, tag, offset, nbytes = _wav_layout(wav)
    n = nbytes // (4 * nch)
    body = np.full((n, nch), np.nan, dtype="<f4")
    fmt_chunk = struct.pack("<HHIIHH", 3, nch, sr, sr * 4 * nch, 4 * nch, 32)
    riff = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt_chunk + b"data" + struct.pack("<I", body.nbytes) + body.tobytes()
    nan_wav = tmp_path / "nan.wav"
    nan_wav.write_bytes(b"RIFF" + struct.pack("<I", len(riff)) + riff)
    from datamodules.easycom import load_session_utterances, read_wav_mono

    with pytest.raises(EasyComFormatError, match=f"{nan_wav}: {n} samples are NaN or infinite"):
        read_wav_mono(nan_wav, (0,))
    js = root / "Main/Speech_Transcriptions/Session_1/00-00-000.json"
    js.write_text("{bad json")
    with pytest.raises(EasyComFormatError, match=f"{js}: not valid JSON"):
        load_session_utterances(root, "Session_1")
    notes = js.parent / "notes.json"
    notes.write_text("[]")
    with pytest.raises(EasyComFormatError, match=f"{notes}: transcript name is not a mm-ss-SSS time code"):
        load_session_utterances(root, "Session_1")
    (wav.parent / "00-05-000.wav").unlink()
    seg_dir = root / "Main/Video_Compressed/Session_1/00-07-000.mp4"
    seg_dir.mkdir()
    with pytest.raises(EasyComFormatError, match=f"{seg_dir}: a directory, not a segment file"):
        list_segments(root, "Session_1")
    seg_dir.rmdir()
    odd = root / "Main/Video_Compressed/Session_1/copy.mp4"
    odd.write_bytes(b"")
    with pytest.raises(EasyComFormatError, match=f"{odd}: segment name is not a mm-ss-SSS time code"):
        list_segments(root, "Session_1")
    for field, value in (("sessions_per_batch", 0), ("sessions_per_batch", -3), ("num_workers", -1),
                         ("sessions_per_batch", 2.5)):
        with pytest.raises(SettingError, match=f"data.init_args.{field}={value!r}: expected an integer >= "):
            EasyComStreamDataModule(str(root), **{field: value})


def test_a_failing_lockstep_group_is_retried_one_session_at_a_time(model_dir, monkeypatch):
    """When the lockstep group raises, its sessions run one at a time; the one that fails alone becomes an error
    record, the others are extracted; a decode error item passes through as an error record."""
    from lightning_modules import omni_extractor as ox

    module = OmniFeatureExtractor(str(model_dir), mode=COMPLETED_BLOCK_HOLD, verify_rows=0, sessions_per_batch=4)

    def session(name, seed):
        f, a = media(2.0, seed)
        return {"session": name, "timeline_end_s": 2.0, "gap_policy": "reset",
                "streams": [{"start_s": 0.0, "frames": torch.from_numpy(f), "audio": torch.from_numpy(a)}]}

    import weakref

    real = ox.extract_session
    held = []

    def flaky(runner, s, *a, **kw):
        assert held[0]() is None           # the failed group's tensors are freed before the retries run
        if s["session"] == "Session_2":
            raise RuntimeError("cannot build the cache")
        return real(runner, s, *a, **kw)

    def group_fails(*a, **kw):
        caches = torch.ones(4)             # stands for the group's KV caches
        held.append(weakref.ref(caches))
        raise torch.OutOfMemoryError("out of memory in the lockstep group")

    monkeypatch.setattr(ox, "extract_sessions", group_fails)
    monkeypatch.setattr(ox, "extract_session", flaky)
    batch = [session("Session_1", 0), session("Session_2", 1), {"session": "Session_3", "error": "x.mp4: bad"},
             session("Session_4", 2)]
    recs = module.predict_step(batch)
    assert [r["session"] for r in recs] == ["Session_1", "Session_2", "Session_3", "Session_4"]
    assert "error" not in recs[0] and "error" not in recs[3]
    assert torch.equal(recs[0]["tensors"]["states"], real(module.runner, batch[0], COMPLETED_BLOCK_HOLD, 8.0,
                                                          0)["tensors"]["states"])
    assert recs[1]["error"] == "RuntimeError: cannot build the cache"
    assert recs[0]["meta"]["lockstep_fallback"] == "OutOfMemoryError: out of memory in the lockstep group"
    assert not any(k.startswith("computed_") for k in recs[0]["meta"])   # the one-session path: none measured
    assert recs[2] == {"session": "Session_3", "mode": COMPLETED_BLOCK_HOLD, "error": "x.mp4: bad",
                       "meta": {"memory_policy": WINDOW}}
    with pytest.warns(UserWarning, match="hands over one session at a time"):     # a dict item: the one-session path
        assert module.predict_step({"session": "Session_9", "error": "y.wav: bad"})["error"] == "y.wav: bad"

    def nan_states(runner, s, *a, **kw):
        rec = real(runner, s, *a, **kw)
        rec["tensors"]["states"][2:4] = float("inf")
        return rec

    monkeypatch.setattr(ox, "extract_session", nan_states)
    rec = module.predict_step(session("Session_5", 3))
    assert rec["error"].startswith("2 rows of states are NaN or infinite") and "tensors" not in rec

    # errors every later session would repeat end the run instead of becoming one record per session
    from algorithms.errors import SettingError

    for fatal in (RuntimeError("CUDA error: an illegal memory access was encountered"), SettingError("bad value")):
        def broken(*a, _e=fatal, **kw):
            raise _e

        monkeypatch.setattr(ox, "extract_session", broken)
        with pytest.raises(type(fatal)):
            module.predict_step(session("Session_6", 4))
        monkeypatch.setattr(ox, "extract_sessions", broken)
        with pytest.raises(type(fatal)):
            module.predict_step([session("Session_6", 4), session("Session_7", 5)])
    with pytest.raises(SettingError, match="memory_s=7.0 must be a positive multiple"):
        OmniFeatureExtractor(str(model_dir), memory_s=7.0)
