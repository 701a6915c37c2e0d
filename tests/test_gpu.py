"""GPU checks (opt-in: ``pytest -m gpu``): the CUDA-graph decode step and the frame-batched vision attention give
the same results as the eager paths on the tiny model in fp32."""
import pytest
import torch

from tests.conftest import MEDIA

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def cuda_vlm(tiny_vl3_dir):
    from models.videollama3 import BudgetedVideoLlama3

    return BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir).to("cuda")


def test_graph_decode_equals_sequential_on_cuda(cuda_vlm):
    from datamodules.decoding import decode_video
    from models.videollama3 import prepare_budgets

    dec = decode_video(MEDIA / "cockatoo.mp4", 1024)
    qs = ["What animal is shown?\nA. A dog.\nB. A cockatoo.", "Colour?\nA. White.\nB. Green.", "x" * 40]
    for bi in prepare_budgets(cuda_vlm, dec.frames.cuda(), dec.times_s, [128, 1024]):
        seq = [a.token_ids for a in cuda_vlm.answer_all(bi.prompt, qs, 12)]
        for mode in ("dynamic", "static", "graph"):
            got = [a.token_ids for a in cuda_vlm.answer_batched(bi.prompt, qs, 12, decode=mode)]
            assert got == seq, mode
        forced = cuda_vlm.answer_batched(bi.prompt, qs, 7, ignore_eos=True, decode="graph")
        assert [len(a.token_ids) for a in forced] == [7, 7, 7]


def test_frame_batched_attention_on_cuda(cuda_vlm):
    from datamodules.decoding import decode_video

    dec = decode_video(MEDIA / "cockatoo.mp4", 1024)
    frames = dec.frames[:6].cuda()
    batched, _ = cuda_vlm.encode(frames, 144)
    cuda_vlm.set_vision_attention("sdpa")
    try:
        looped, _ = cuda_vlm.encode(frames, 144)
    finally:
        cuda_vlm.set_vision_attention("frame_batched")
    assert torch.allclose(batched, looped, atol=1e-4, rtol=1e-4)


def test_shared_prefix_attention_bf16_flash_on_cuda():
    """The CUDA bf16 prefix part (flash kernel with log-sum-exp) merges to full attention within bf16 rounding."""
    import types

    from models import shared_prefix as sp

    torch.manual_seed(0)
    rows, heads, kv, d, L, s, S = 3, 28, 4, 128, 1000, 5, 9
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(rows, heads, s, d, device=dev, dtype=dt)
    pk, pv = (torch.randn(1, kv, L, d, device=dev, dtype=dt) for _ in range(2))
    sk, sv = (torch.randn(rows, kv, S, d, device=dev, dtype=dt) for _ in range(2))
    mask = torch.zeros(rows, 1, s, S, device=dev, dtype=dt).masked_fill(
        torch.rand(rows, 1, s, S, device=dev) > 0.5, torch.finfo(dt).min)
    with sp.shared_prefix([types.SimpleNamespace(keys=pk, values=pv)]):
        got, _ = sp.shared_prefix_sdpa(types.SimpleNamespace(layer_idx=0), q, sk, sv, mask)
    full_k = torch.cat([pk.expand(rows, -1, -1, -1), sk], 2).repeat_interleave(heads // kv, 1).float()
    full_v = torch.cat([pv.expand(rows, -1, -1, -1), sv], 2).repeat_interleave(heads // kv, 1).float()
    full_mask = torch.cat([torch.zeros(rows, 1, s, L, device=dev), mask.float()], -1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), full_k, full_v, attn_mask=full_mask)
    assert (got.float() - ref.transpose(1, 2)).abs().max() < 2e-2
