"""EasyCom release-layout reading, stream planning by time code, causal audio decoding, and the DataModule."""
import json

import numpy as np
import pytest

from datamodules.easycom import (EasyComFormatError, EasyComSessionStreams, EasyComStreamDataModule, Segment,
                                 format_time_code, list_segments, list_sessions, load_session_utterances,
                                 parse_time_code, plan_streams, read_wav_mono, resample_causal)
from datamodules.easycom_fixture import CHANNEL_GAINS, build_easycom_fixture


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    # small frames for speed; the folder/file layout is the release's exactly
    return build_easycom_fixture(tmp_path_factory.mktemp("easycom"), width=320, height=180)


def test_layout_and_time_codes(root):
    assert (root / "Main/Video_Compressed/Session_1/00-04-300.mp4").is_file()
    assert (root / "Main/Glasses_Microphone_Array_Audio/Session_1/00-04-300.wav").is_file()
    assert (root / "Main/Speech_Transcriptions/Session_1/00-04-300.json").is_file()
    assert list_sessions(root) == ["Session_1", "Session_2"]
    assert [s.name for s in list_segments(root, "Session_1")] == ["00-00-000", "00-04-300", "00-10-000"]
    assert parse_time_code("01-02-350.mp4") == pytest.approx(62.35) and format_time_code(62.35) == "01-02-350"
    with pytest.raises(EasyComFormatError):
        parse_time_code("segment1.mp4")


def test_utterances_on_session_timeline(root):
    utts = load_session_utterances(root, "Session_1")
    raw = json.loads((root / "Main/Speech_Transcriptions/Session_1/00-04-300.json").read_text())[0]
    u = [x for x in utts if x.segment == "00-04-300"][0]
    assert u.start_s == pytest.approx(4.3 + raw["Start_Frame"] / 20) and u.end_s == pytest.approx(4.3 + raw["End_Frame"] / 20)
    assert isinstance(u.participant_id, int) and u.text == raw["Transcription"]
    assert u.target_of_speech == raw["Target_of_Speech"]
    assert [x.start_s for x in utts] == sorted(x.start_s for x in utts)


def test_gap_policy(root):
    segs = list_segments(root, "Session_1")
    durs = [4.0, 4.0, 4.0]
    reset = plan_streams(segs, durs)  # 0.3 s gap bridged, 1.7 s gap resets
    assert [(p.start_s, round(p.end_s, 3), len(p.pieces)) for p in reset] == [(0.0, 8.3, 2), (10.0, 14.0, 1)]
    bridge = plan_streams(segs, durs, gap_policy="bridge")
    assert len(bridge) == 1 and len(bridge[0].pieces) == 3
    strict = plan_streams(segs, durs, max_gap_s=0.2)
    assert len(strict) == 3
    off = [Segment("00-10-050", 10.05, segs[0].video, segs[0].audio, None)]
    p = plan_streams(off, [4.0])[0]
    assert p.start_s == pytest.approx(10.2) and p.pieces[0][1] == pytest.approx(0.15)  # snapped to the 0.2 s grid
    with pytest.raises(ValueError, match="gap_policy"):
        plan_streams(segs, durs, gap_policy="fill")


def test_wav_channels_and_causal_resampling(root):
    wav = root / "Main/Glasses_Microphone_Array_Audio/Session_2/00-00-000.wav"
    ear, sr = read_wav_mono(wav, (4, 5))
    ch0, _ = read_wav_mono(wav, (0,))
    assert sr == 48000
    k = np.argmax(np.abs(ch0))
    assert ear[k] / ch0[k] == pytest.approx((CHANNEL_GAINS[4] + CHANNEL_GAINS[5]) / 2 / CHANNEL_GAINS[0], rel=0.02)
    with pytest.raises(EasyComFormatError, match="out of range"):
        read_wav_mono(wav, (6,))
    x = np.random.default_rng(0).standard_normal(4800).astype(np.float32)
    y = resample_causal(x, 48000)
    x2 = x.copy()
    x2[3000:] = 0
    y2 = resample_causal(x2, 48000)
    assert len(y) == 1600 and np.array_equal(y[:1000], y2[:1000])  # output before 62.5 ms ignores later input


def test_stream_decoding(root):
    ds = EasyComSessionStreams(root, frame_height=56, frame_width=96)
    item = ds[0]
    assert item["session"] == "Session_1" and len(item["streams"]) == 2
    s0 = item["streams"][0]
    n = int(s0["duration_s"] * 2 + 1e-6)
    assert s0["frames"].shape == (n, 56, 96, 3) and s0["frames"].dtype.__str__() == "torch.uint8"
    assert s0["audio"].shape[0] == round(s0["duration_s"] * 16000) and s0["audio"].abs().max() > 0
    assert float(s0["frame_times"][0]) == 0.5 and item["streams"][1]["start_s"] == 10.0
    gap = s0["audio"][int(4.26 * 16000): int(4.29 * 16000)]  # bridged 0.3 s gap: silence
    assert float(gap.abs().max()) == 0.0


def test_datamodule_decodes_in_workers(root):
    dm = EasyComStreamDataModule(str(root), sessions=["Session_2"], frame_height=56, frame_width=96, num_workers=1)
    batches = list(dm.predict_dataloader())
    assert len(batches) == 1 and batches[0]["session"] == "Session_2"
    st = batches[0]["streams"][0]
    assert st["frames"].shape[0] == 2 and st["audio"].shape[0] == pytest.approx(1.2 * 16000, abs=400)


def test_empty_root_and_missing_channels_fail_at_construction(root, tmp_path):
    from algorithms.errors import SettingError

    empty = tmp_path / "E"
    for d in ("Video_Compressed", "Glasses_Microphone_Array_Audio", "Speech_Transcriptions"):
        (empty / "Main" / d).mkdir(parents=True)
    with pytest.raises(EasyComFormatError, match=rf"^{empty / 'Main/Video_Compressed'}: no Session_<n> folders"):
        EasyComSessionStreams(empty)
    wav = root / "Main/Glasses_Microphone_Array_Audio/Session_1/00-00-000.wav"
    n = len(CHANNEL_GAINS)
    with pytest.raises(SettingError, match=rf"^data.init_args.audio_channels=\[4, {n + 2}\]: {wav} has {n} channels "
                                           rf"\(0-based indices 0..{n - 1}\), so \[{n + 2}\] do not exist"):
        EasyComSessionStreams(root, audio_channels=[4, n + 2])
    assert EasyComSessionStreams(root, audio_channels=[n - 1]).audio_channels == (n - 1,)


def test_wav_without_video_is_one_line_once(tmp_path, caplog):
    """A segment video renamed by accident leaves its wav an orphan: the run says so in one console line naming the
    wav, once, though the session's segments are listed several times (setting check, planning, decoding)."""
    import logging
    import shutil

    root = build_easycom_fixture(tmp_path / "ec", width=96, height=56,
                                 sessions={"Session_1": [("00-00-000", "cockatoo.mp4", 0.0, 2.0, "realshort.mp4")]})
    wav = root / "Main/Glasses_Microphone_Array_Audio/Session_1/00-00-000.wav"
    shutil.copy(wav, wav.parent / "00-05-000.wav")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert [s.name for s in list_segments(root, "Session_1")] == ["00-00-000"]
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [f"{wav.parent}: 00-05-000.wav without a video in {root / 'Main/Video_Compressed/Session_1'}; "
                    "those segments are left out of the session"]
