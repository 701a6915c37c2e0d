"""The seeds' token compressor on the GPU: the batched call against a loop over windows (one call per group).

``python bench/compressor_throughput.py [--repeats 5]`` (needs only torch + safetensors: runs on the lent H200
without carried wheels). Shapes: VideoLLaMA3's vision width C = 1152, the fork's training defaults (8 layers, 8
heads, intermediate 4 * 1152), K = 64 queries; videos at the budgets' frame caps: B = 4096 -> 512 frames at 64
merged tokens each, B = 16384 -> 2048 frames at 64 tokens each (8 * B / T), cut into ``T // 4 + 1`` adaptive
groups (the seeds' rule). Prints, per budget: windows, KV rows, the max |difference| of the batched call against
the per-window loop in fp32 (``match_encoder_scale`` off, where windows are independent), and median times (bf16,
``match_encoder_scale`` on) of both.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from algorithms.segmentation import adaptive_segment_lengths  # noqa: E402
from models.videollama3.qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor  # noqa: E402

C = 1152


def build(scale: bool, dtype, device):
    torch.manual_seed(0)
    m = TransformerDecoderFlatCompressor(TokenCompressorConfig(
        compressor_type="transformer_decoder_flat", hidden_size=C, intermediate_size=4 * C, num_layers=8,
        num_attention_heads=8, num_queries=64, match_encoder_scale=scale))
    with torch.no_grad():
        m.query.normal_(0.0, 1.0)
    return m.to(device, dtype).eval()


def video(num_frames: int, hw: int, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(1)
    base = torch.randn(num_frames // 16 + 1, C, generator=g)              # slow drift: scenes of 16 frames
    per_frame = base.repeat_interleave(16, 0)[:num_frames] + 0.3 * torch.randn(num_frames, C, generator=g)
    rows = per_frame[:, None, :] + torch.randn(num_frames, hw, C, generator=g)
    seg = adaptive_segment_lengths(rows.mean(1))
    cu = [0]
    for n in seg:
        cu.append(cu[-1] + n * hw)
    return rows.reshape(-1, C).to(device, dtype), cu


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


@torch.no_grad()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--grid", type=int, nargs=2, default=(8, 8), help="merged grid (h, w) per frame")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    h, w = args.grid
    rows_out = []
    for budget, frames in ((4096, 512), (16384, 2048)):
        if device == "cpu":
            frames //= 16
        kv32, cu = video(frames, h * w, device, torch.float32)
        grids = [(h, w)] * (len(cu) - 1)
        m32 = build(False, torch.float32, device)
        batched = m32(kv32, cu, grids)
        loop = torch.cat([m32(kv32[a:b], [0, b - a], [(h, w)]) for a, b in zip(cu, cu[1:])])
        diff = (batched - loop).abs().max().item()
        scale_of = batched.abs().max().item()
        m16 = build(True, torch.bfloat16, device)
        kv16 = kv32.to(torch.bfloat16)
        t_batched = timed(lambda: m16(kv16, cu, grids), args.repeats)
        m16.match_encoder_scale = False        # the loop cannot share the call's statistics: time it without them
        t_loop = timed(lambda: [m16(kv16[a:b], [0, b - a], [(h, w)]) for a, b in zip(cu, cu[1:])], args.repeats)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        rows_out.append((budget, frames, len(cu) - 1, kv32.shape[0], diff, scale_of, t_batched, t_loop, peak))
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (frames / 16)'}; grid {h}x{w}")
    print("| budget | frames | windows | KV rows | fp32 max|batched - loop| (max|out|) | batched bf16 s | loop bf16 s "
          "| loop / batched | peak GiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b, f, nw, n, d, s, tb, tl, pk in rows_out:
        print(f"| {b} | {f} | {nw} | {n} | {d:.2e} ({s:.1f}) | {tb:.4f} | {tl:.4f} | {tl / tb:.1f} | {pk:.1f} |")


if __name__ == "__main__":
    main()
