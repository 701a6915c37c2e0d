"""Frames held at the encoder's sizes (issue 25, target 4): same encoder inputs as the decode-size path, bounded memory.

The reference path is today's: decode every sampled frame at the decode size (here forced to the reduced,
decoder-side-resized path by ``native_decode_bytes=0``), then let ``BudgetedVideoLlama3.encode``'s processor resize.
"""
from __future__ import annotations

import pytest
import torch

from algorithms.budget import encoder_grids, frame_grid
from datamodules.decode import EncoderFrames, EncoderSizing, decode_video, held_bytes, hold_chunk_frames
from tests.media_factory import make_testsrc_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """40 s of 16:9 testsrc2 at 4 fps (160 native frames), 640x360, GOP 8."""
    return make_testsrc_clip(tmp_path_factory.mktemp("hold") / "clip.mp4", 40, 4, 640, 360)


def _sizing(vlm, budgets, mtpf=256, raw_mode="phase3", raw_max_tokens=256):
    return EncoderSizing(tuple(budgets), mtpf, raw_mode, raw_max_tokens, vlm.video_processor)


def _decode(path, budgets, sizing=None, **kw):
    return decode_video(path, max(budgets), decode_max_side=500, native_decode_bytes=0, sizing=sizing, **kw)


# ------------------------------------------------------------------ the memory-bounding logic (hand-computed)
def test_hour_of_1080p_is_held_at_one_small_grid():
    # an hour of 1080p at B = 16384: 2048 frames decoded at 896x504 (decode_max_side); both budgets of
    # configs/predict/videomme.yaml cap frames at 8 B / T_b = 64 tokens: smart_resize(504, 896, max 64 * 28²)
    # has beta = sqrt(504 * 896 / 50176) = 3 -> floor(168 / 28) = 6, floor(298.7 / 28) = 10 cells
    grids = encoder_grids(504, 896, 2048, [4096, 16384], 256, "phase3", 256)
    assert grids == {(6, 10): (list(range(2048)), 64)}
    assert held_bytes(grids) == 2048 * (28 * 6) * (28 * 10) * 3 == 289_013_760         # vs 2048 * 504 * 896 * 3 = 2_774_532_096 at the decode size
    assert hold_chunk_frames(504, 896, 64e6) == 47   # 64e6 // 1_354_752


def test_encoder_grids_lists_the_union_of_frames_and_no_raw_grid():
    # T = 20 frames of 180x320. B = 64: max_frames 8 -> 8 of 20 evenly spaced, cap 8 * 64 // 8 = 64; B = 128:
    # 16 of 20, cap 8 * 128 // 16 = 64. smart_resize(180, 320): rounded 168x308 = 66 cells; at 64, beta =
    # sqrt(57600 / 50176) -> floor(168 / 28) = 6, floor(298.7 / 28) = 10. The phase3 raw frames (cap 24 < 60
    # cells) are re-encoded from the (6, 10) pixel rows (seed 001 reencode): no grid of their own is held
    g = encoder_grids(180, 320, 20, [64, 128], 256, "phase3", 24)
    assert frame_grid(180, 320, 64) == (6, 10)
    b64 = [i * 19 // 7 for i in range(8)]             # np.linspace(0, 19, 8, dtype=int): truncation (seeds' rule)
    b128 = [i * 19 // 15 for i in range(16)]
    union = sorted(set(b64) | set(b128))
    assert g == {(6, 10): (union, 64)}
    assert encoder_grids(180, 320, 20, [64, 128], 256, "orig", 24) == {(6, 10): (union, 64)}
    with pytest.raises(ValueError, match="raw_mode"):
        encoder_grids(180, 320, 20, [64], 256, "other", 24)


def test_encoder_frames_reads_only_what_it_holds():
    t = torch.arange(3 * 28 * 56 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).view(3, 28, 56, 3)
    ef = EncoderFrames((10, 90, 160, 3), {(1, 2): (t, [2, 5, 7])})
    assert ef.shape == torch.Size([10, 90, 160, 3]) and len(ef) == 10 and ef.nbytes == t.numel()
    assert torch.equal(ef.at_grid([7, 2], (1, 2)), t[[2, 0]])
    assert torch.equal(ef.to("cpu").at_grid([5], (1, 2)), t[[1]])
    with pytest.raises(KeyError, match=r"not held at grid \(1, 2\)"):
        ef.at_grid([3], (1, 2))
    with pytest.raises(KeyError, match="held at grids"):
        ef.at_grid([2], (2, 4))
    with pytest.raises(TypeError, match="at_grid"):
        ef[0]


def test_encoder_frames_pin_memory_pins_every_held_grid(monkeypatch):
    """The DataLoader's pin-memory thread calls ``pin_memory()`` on an item's objects that have it: every held
    grid is pinned, positions and shape kept (pinning itself needs CUDA: recorded here instead)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: pinned.append(self) or self.clone())
    a, b = torch.zeros(2, 28, 28, 3, dtype=torch.uint8), torch.ones(1, 56, 28, 3, dtype=torch.uint8)
    ef = EncoderFrames((4, 90, 160, 3), {(1, 1): (a, [0, 3]), (2, 1): (b, [1])})
    got = pin_memory({"frames": ef, "times_s": [0.0, 1.0]})["frames"]
    assert isinstance(got, EncoderFrames) and got.shape == ef.shape and len(pinned) == 2
    assert {g: p for g, (_, p) in got.held.items()} == {(1, 1): [0, 3], (2, 1): [1]}
    assert torch.equal(got.at_grid([1], (2, 1)), b)


# ------------------------------------------------------------------ equality with the decode-size path
@pytest.mark.parametrize("budgets,mtpf,raw_mode,raw_max", [
    ((64, 256), 256, "phase3", 256),
    ((64, 512), 16, "phase3", 8),      # cap 16: the grid is below the processor's min_pixels once resized
    ((256,), 256, "phase3", 4),        # raw frames re-encoded smaller: 32 frames x <= 4 rows fit raw in 256
    ((128, 256), 256, "orig", 256),
])
def test_held_frames_give_the_same_encoder_inputs(tiny_vlm, clip, budgets, mtpf, raw_mode, raw_max):
    from models.videollama3 import EncodeCache, prepare_budgets

    sizing = _sizing(tiny_vlm, budgets, mtpf, raw_mode, raw_max)
    ref = _decode(clip, budgets)
    new = _decode(clip, budgets, sizing, hold_chunk_bytes=5 * 282 * 500 * 3)   # 5 frames a chunk: many chunks
    assert isinstance(new.frames, EncoderFrames) and not isinstance(ref.frames, EncoderFrames)
    assert new.times_s == ref.times_s and new.info == ref.info and ref.info["decode_hw"] == [282, 500]
    assert new.frames.shape == ref.frames.shape
    assert new.frames.nbytes < ref.frames.numel()
    # the pixel values the vision encoder gets, per grid, for every frame held there
    for grid, (pos, cap) in sizing.grids(*ref.frames.shape[:3]).items():
        size = {"shortest_edge": min(16, cap) * 784, "longest_edge": cap * 784 * len(pos)}
        kw = dict(do_sample_frames=False, use_token_compression=False, size=size, return_tensors="pt")
        a = tiny_vlm.video_processor(videos=[ref.frames[pos].permute(0, 3, 1, 2)], **kw)
        b = tiny_vlm.video_processor(videos=[new.frames.at_grid(pos, grid).permute(0, 3, 1, 2)], do_resize=False,
                                     **kw)
        assert a["video_grid_thw"][0].tolist() == [len(pos), 2 * grid[0], 2 * grid[1]]
        assert torch.equal(a["pixel_values_videos"], b["pixel_values_videos"])
    # and everything prepare_budgets builds from them
    c_ref, c_new = EncodeCache(tiny_vlm, ref.frames, 4), EncodeCache(tiny_vlm, new.frames.to("cpu"), 4)
    out_ref = prepare_budgets(tiny_vlm, ref.frames, ref.times_s, list(budgets), raw_mode, raw_max, mtpf, 4, c_ref)
    out_new = prepare_budgets(tiny_vlm, c_new.frames, new.times_s, list(budgets), raw_mode, raw_max, mtpf, 4, c_new)
    assert c_new.encode_calls == c_ref.encode_calls and c_new.reencode_calls == c_ref.reencode_calls
    if raw_max == 4:    # every frame raw, re-encoded (seed 001 reencode) from the encode grid's pixel rows
        assert out_ref[0].plan.mode == "raw" and out_ref[0].raw_grid[0] * out_ref[0].raw_grid[1] <= 4
        assert c_ref.reencode_calls == [(out_ref[0].grid, out_ref[0].raw_grid, 32)]
    for x, y in zip(out_ref, out_new):
        assert (x.budget, x.frame_idx, x.grid, x.raw_grid, x.plan) == (y.budget, y.frame_idx, y.grid, y.raw_grid, y.plan)
        assert torch.equal(x.prompt.ids, y.prompt.ids)
        assert torch.equal(x.prompt.vision_embeds, y.prompt.vision_embeds)


def test_held_frames_at_native_size(tiny_vlm, clip):
    # the native-size path (no decoder-side resize) is held the same way
    sizing = _sizing(tiny_vlm, (256,))
    ref = decode_video(clip, 256)
    new = decode_video(clip, 256, sizing=sizing, hold_chunk_bytes=1)   # one frame a chunk
    assert ref.info["decode_hw"] == [360, 640] and new.info == ref.info and isinstance(new.frames, EncoderFrames)
    for grid, (pos, cap) in sizing.grids(*ref.frames.shape[:3]).items():
        assert torch.equal(new.frames.at_grid(pos, grid), sizing.resize(ref.frames[pos], cap))


def test_decode_size_kept_when_holding_saves_nothing(tiny_vlm, clip):
    # 40 frames at 282x500 (141000 px): B = 1024 reads all 40 at cap 8 * 1024 // 40 = 204 -> frame_grid (10, 18)
    # = 280x504 (141120 px) alone; with B = 128's 16 frames at (6, 10) on top, holding exceeds 40 * 141000 * 3
    sizing = _sizing(tiny_vlm, (128, 1024))
    grids = sizing.grids(40, 282, 500)
    assert held_bytes(grids) == 40 * 280 * 504 * 3 + 16 * 168 * 280 * 3 > 40 * 282 * 500 * 3
    dec = _decode(clip, (128, 1024), sizing)
    assert isinstance(dec.frames, torch.Tensor) and torch.equal(dec.frames, _decode(clip, (128, 1024)).frames)


def test_data_module_setting_is_checked():
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    with pytest.raises(SettingError, match="hold_encoder_sizes"):
        VideoQADataModule(hold_encoder_sizes="yes")


def test_predict_records_equal_with_and_without_holding(tiny_vl3_dir, demo_bench, tmp_path, monkeypatch):
    import datamodules.video_items as vq
    from tests.conftest import run_predict

    kinds = []
    real = vq.decode_video

    def spy(*a, **kw):
        dec = real(*a, **kw)
        kinds.append(type(dec.frames).__name__)
        return dec

    monkeypatch.setattr(vq, "decode_video", spy)
    # (two answer tokens: the records compared carry the plans, fed by the encoder's rows, and the first tokens)
    on = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "on", budgets=(256, 1024), model_args={"max_new_tokens": 2})
    assert "EncoderFrames" in kinds          # cockatoo (720p) is held at the encoder's sizes
    off = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "off", budgets=(256, 1024),
                      extra=["--data.init_args.hold_encoder_sizes=false"], model_args={"max_new_tokens": 2})
    assert kinds.count("EncoderFrames") == 1
    key = lambda r: (r["job"], r["qid"])  # noqa: E731
    assert len(on) == 14 and sorted(on, key=key) == sorted(off, key=key)
