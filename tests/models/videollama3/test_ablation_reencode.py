"""Seed 001:1200 ``reencode`` (and seed 000:1178 / 1199, which call it): encoder rows at an explicit merged grid, "processed
at the groups' size ``tok``, then the pixel rows resized and passed through the encoder again", against an
independent path on the tiny model: the processor's own resize and the normalisation written out, the image
interpolated, patched by hand in the processor's block order, and the vision model called on it directly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithms.budget import frame_grid, raw_frame_grid


@pytest.fixture(scope="module")
def frames():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 120, 200, 3), dtype=torch.uint8, generator=g)
    return x


def _normalized_image(vp, frames, cap):
    """(t, 3, 28 gh, 28 gw) fp32: the processor's resize of the frames, then rescale and normalise by hand."""
    from models.videollama3.frame_sizes import processor_resize

    img = processor_resize(vp, frames, cap).permute(0, 3, 1, 2).float() * vp.rescale_factor
    mean = torch.tensor(vp.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(vp.image_std).view(1, 3, 1, 1)
    return (img - mean) / std


def _patch_by_hand(img, p=14, m=2):
    """Flat pixel rows in VideoLLaMA3's order: frame, merged row, merged column, then the m x m patches of the
    cell row-major, each patch (C, p, p) flattened."""
    t, c, h, w = img.shape
    rows = []
    for f in range(t):
        for i in range(h // (p * m)):
            for j in range(w // (p * m)):
                for a in range(m):
                    for b in range(m):
                        y, x = (i * m + a) * p, (j * m + b) * p
                        rows.append(img[f, :, y:y + p, x:x + p].reshape(-1))
    return torch.stack(rows)


def test_unpatchify_inverts_the_processor_layout(tiny_vlm, frames):
    from models.videollama3.encoding import unpatchify

    vp = tiny_vlm.video_processor
    grid = frame_grid(120, 200, 64)
    assert grid == (4, 7)   # round(120 / 28) = 4, round(200 / 28) = 7: 28 cells <= 64, kept
    pixels, t = tiny_vlm._pixel_rows(frames, 64, grid, resize=True)
    ref = _normalized_image(vp, frames, 64)                                   # (3, 3, 112, 196)
    img = unpatchify(pixels, t, grid, vp.patch_size, vp.merge_size)
    assert img.shape == ref.shape and torch.allclose(img, ref, atol=1e-5)
    assert torch.allclose(_patch_by_hand(ref), pixels, atol=1e-5)


@pytest.mark.parametrize("grid", [(2, 3), (3, 5)])
def test_reencode_equals_an_independent_path(tiny_vlm, frames, grid):
    vp = tiny_vlm.video_processor
    src = frame_grid(120, 200, 64)                                            # (4, 7), the groups' size
    got = tiny_vlm.reencode(frames, 64, grid)
    # independent: the normalised image at the groups' size, bicubic antialiased to 28 gh' x 28 gw', hand-patched
    img = F.interpolate(_normalized_image(vp, frames, 64), size=(28 * grid[0], 28 * grid[1]), mode="bicubic",
                        align_corners=False, antialias=True)
    pixels = _patch_by_hand(img)
    t = frames.shape[0]
    vis = tiny_vlm.model.model.vision_model(pixel_values=pixels, grid_thw=torch.tensor([[t, 2 * grid[0], 2 * grid[1]]]),
                                            merge_sizes=torch.tensor([2]))
    ref = vis.last_hidden_state.view(t, grid[0] * grid[1], -1)
    assert got.shape == ref.shape and torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    # not the direct encode at the smaller size: the seed's path resizes the groups' pixels, not the frame
    direct, g2 = tiny_vlm.encode(frames, grid[0] * grid[1])
    if g2 == grid:
        assert not torch.allclose(direct, got, atol=1e-3)
    # chunking changes nothing (the encoder attends within a frame)
    assert torch.equal(tiny_vlm.reencode(frames, 64, grid, chunk_frames=1), got)
    assert src != grid


def test_reencode_at_the_groups_grid_is_the_encode(tiny_vlm, frames):
    rows, grid = tiny_vlm.encode(frames, 64)
    assert torch.equal(tiny_vlm.reencode(frames, 64, grid), rows)


def test_encode_cache_reencodes_once_per_grid_pair(tiny_vlm, frames):
    from models.videollama3 import EncodeCache

    cache = EncodeCache(tiny_vlm, frames)
    small = raw_frame_grid(4, 7, 12)   # 28 > 12 cells: beta = sqrt(28 / 12) = 1.5275 -> floor(2.62), floor(4.58)
    assert small == (2, 4)
    cache.reencode([([0, 2], 64, small), ([2, 1], 64, small), ([0], 64, (4, 7))])
    assert cache.reencode_calls == [((4, 7), (2, 4), 3)]                     # the union, one call
    assert cache.encode_calls == [((4, 7), 1)]                               # same grid: the encode's rows
    got = cache.get_reencoded([2, 0], 64, small)
    assert cache.reencode_calls == [((4, 7), (2, 4), 3)]                     # cached
    assert torch.equal(got, tiny_vlm.reencode(frames[[2, 0]], 64, small))
    assert torch.equal(cache.get_reencoded([0], 64, (4, 7)), cache.get([0], 64))
