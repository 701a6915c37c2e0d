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
