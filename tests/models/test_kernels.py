"""models/kernels.py: the fused forwards hold exactly the library's math (bit-identical where they run eagerly, the
CPU), bind and unbind cleanly, and the patched rotary is the library's function off CUDA."""
import pytest
import torch

from models import fused_forwards as forwards
from models import kernels as fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_functions_equal_library_math(dtype):
    from transformers.activations import ACT2FN
    from transformers.models.qwen2 import modeling_qwen2 as mq

    torch.manual_seed(0)
    norm = mq.Qwen2RMSNorm(24, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 7, 24, dtype=dtype) * 3
    assert torch.equal(fused.rms_norm(x, norm.weight, norm.variance_epsilon), mq.Qwen2RMSNorm.forward(norm, x))
    q, k = torch.randn(2, 4, 7, 16, dtype=dtype), torch.randn(2, 2, 7, 16, dtype=dtype)
    cos, sin = torch.randn(2, 7, 16, dtype=dtype), torch.randn(2, 7, 16, dtype=dtype)
    original = forwards._ROPE_ORIGINAL.get(mq.__name__, mq.apply_rotary_pos_emb)
    for got, want in zip(fused.rope(q, k, cos, sin), original(q, k, cos, sin)):
        assert torch.equal(got, want)
    g, u = torch.randn(3, 40, dtype=dtype), torch.randn(3, 40, dtype=dtype)
    assert torch.equal(fused.silu_mul(g, u), ACT2FN["silu"](g) * u)


def test_fuse_binds_unbinds_and_keeps_logits_on_cpu(tiny_vlm):
    """On the CPU the fused LLM gives bit-identical logits; every RMSNorm and gated MLP is bound, and unbinding
    restores the library's forwards."""
    lm = tiny_vlm.model.model.language_model
    cfg = lm.config
    ids = torch.randint(0, cfg.vocab_size, (2, 11))
    want_bound = 2 * cfg.num_hidden_layers + 1 + cfg.num_hidden_layers     # two norms per layer, final norm, MLPs
    try:
        assert forwards.fuse(lm, False) == want_bound
        assert not any("forward" in m.__dict__ for m in lm.modules() if type(m).__name__ in forwards.NORM_CLASSES)
        ref = tiny_vlm.model(input_ids=ids).logits
        assert forwards.fuse(lm, True) == want_bound
        assert all("forward" in m.__dict__ for m in lm.modules()
                   if type(m).__name__ in forwards.NORM_CLASSES | forwards.MLP_CLASSES)
        from transformers.models.qwen2 import modeling_qwen2 as mq
        assert mq.apply_rotary_pos_emb.__wrapped__ is forwards._ROPE_ORIGINAL[mq.__name__]
        got = tiny_vlm.model(input_ids=ids).logits
    finally:
        tiny_vlm.set_fused_kernels(True)
    assert torch.equal(got, ref)


def test_fuse_covers_the_omni_thinker(tmp_path):
    """The Qwen2.5-Omni thinker's LLM and vision blocks are bound (their MLPs are gated SiLU); the audio tower's are
    not touched (no RMSNorm / gated MLP there)."""
    from models.omni.tiny import build_tiny_omni
    from models.omni.thinker import OmniThinkerRunner

    runner = OmniThinkerRunner(build_tiny_omni(tmp_path / "omni"), layer=-1)
    model = runner.thinker.model
    text, vision = model.language_model, model.visual
    n_text = sum(1 for m in text.modules() if "forward" in m.__dict__)
    n_vision = sum(1 for m in vision.modules() if "forward" in m.__dict__)
    assert n_text == 3 * text.config.num_hidden_layers + 1
    assert n_vision >= 3 * len(vision.blocks)
    assert not any("forward" in m.__dict__ for m in model.audio_tower.modules())
    assert forwards.fuse(runner.thinker, False) == n_text + n_vision


@pytest.mark.parametrize("bias", [False, True])
def test_padded_gate_up_equals_the_library_mlp(bias):
    """A gated MLP with an intermediate size off the 8-element alignment, zero-padded to 64 with gate and up in one
    GEMM (what runs on CUDA), gives the library's values; the padding is rebuilt when the weights change."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniMLP

    cfg = type("Cfg", (), {"hidden_size": 24, "intermediate_size": 37, "hidden_act": "silu"})()
    torch.manual_seed(0)
    mlp = Qwen2_5OmniMLP(cfg, bias=bias)
    x = torch.randn(5, 24)
    w, b, dw = forwards._padded_gate_up(mlp, x.device)
    assert w.shape == (128, 24) and dw.shape == (24, 64) and (b is None) == (not bias)
    assert torch.count_nonzero(w[37:64]) == 0 and torch.count_nonzero(dw[:, 37:]) == 0
    want = Qwen2_5OmniMLP.forward(mlp, x)
    assert torch.allclose(forwards._padded_mlp(mlp, x), want, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2)                   # in place: a new weight version
    assert torch.allclose(forwards._padded_mlp(mlp, x), Qwen2_5OmniMLP.forward(mlp, x), atol=1e-6, rtol=1e-6)
    assert "_tb_padded" in mlp.__dict__
    with torch.no_grad():                            # the eager (CPU) forward drops copies made for the GPU
        assert torch.equal(forwards._mlp_forward(mlp, x), Qwen2_5OmniMLP.forward(mlp, x))
    assert "_tb_padded" not in mlp.__dict__


@pytest.mark.usefixtures("inductor_kernels")
def test_fusable_marks_rows_dynamic_and_inlines_under_an_outer_compile():
    """Compiled (here with the eager backend on the CPU): new row counts reuse the graph, a new fixed size gets its own
    graph (no automatic dynamic), and inside an outer ``torch.compile`` (``compile_small_calls``) the math is
    inlined instead of calling torch._dynamo from traced code."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs = []                                        # per compiled graph: its symbolic-size inputs

    def backend(gm, example_inputs):
        graphs.append(sum(not isinstance(t, torch.Tensor) for t in example_inputs))
        return gm.forward

    f = fused.Fusable(fused._rms_norm, "test norm", dynamic=(1,), devices=("cpu",), backend=backend)
    w8, w16 = torch.ones(8), torch.ones(16)
    for rows in (3, 5, 7):
        x = torch.randn(rows, 8)
        assert torch.equal(f(x, w8, 1e-6), fused._rms_norm(x, w8, 1e-6))
    assert graphs == [1] and f.state == "ok"           # one graph, rows symbolic
    for rows in (4, 9, 6):
        f(torch.randn(rows, 16), w16, 1e-6)
        f(torch.randn(rows, 8), w8, 1e-6)
    assert graphs == [1, 1]                            # D = 16 got its own graph; D never became symbolic
    outer = torch.compile(lambda x: f(x, w8, 1e-6) * 2, backend="eager", fullgraph=True)
    x = torch.randn(5, 8)
    assert torch.equal(outer(x), fused._rms_norm(x, w8, 1e-6) * 2)


@pytest.mark.usefixtures("inductor_kernels")
@pytest.mark.parametrize("cause", ["backend", "recompile limit"])
def test_fusable_falls_back_when_a_later_compilation_fails(cause, caplog):
    """A graph that compiled and ran, then a new shape whose compilation fails in the backend (as a multi-kernel
    graph read back from Inductor's cache did with torch 2.11 on the H200) or needs more graphs than the recompile
    limit (fullgraph: a hard failure): that call and the later ones run the eager math, with a warning naming the
    function; an error of the compiled graph itself is still raised."""
    import contextlib
    import logging

    import torch._dynamo

    torch._dynamo.reset()
    calls = []

    def backend(gm, example_inputs):
        calls.append(len(example_inputs))
        if len(calls) > 1:
            raise RuntimeError("cannot load the cached kernel")
        return gm.forward

    f = fused.Fusable(fused._rms_norm, "test norm", dynamic=(1,), devices=("cpu",), backend=backend)
    w8, w16 = torch.ones(8), torch.ones(16)
    x = torch.randn(3, 8)
    assert torch.equal(f(x, w8, 1e-6), fused._rms_norm(x, w8, 1e-6)) and f.state == "ok"
    limit = torch._dynamo.config.patch(recompile_limit=1) if cause == "recompile limit" else contextlib.nullcontext()
    if cause == "recompile limit":
        calls.append("no second graph")                # the limit stops it before the backend
    y = torch.randn(4, 16)                             # a new fixed size: a second graph, whose compilation fails
    with caplog.at_level(logging.WARNING, logger="models.kernels"), limit:
        assert torch.equal(f(y, w16, 1e-6), fused._rms_norm(y, w16, 1e-6))
    assert f.state == "failed" and len(calls) == 2
    assert "test norm failed on a new shape" in caplog.text
    assert torch.equal(f(x, w8, 1e-6), fused._rms_norm(x, w8, 1e-6)) and len(calls) == 2   # eager for good

    torch._dynamo.reset()
    g = fused.Fusable(lambda a, b: a @ b, "test mm", dynamic=(1, 1), devices=("cpu",), backend="eager")
    assert g(torch.ones(2, 3), torch.ones(3, 4)).shape == (2, 4) and g.state == "ok"
    with pytest.raises(RuntimeError, match="shape|size") as err:   # the math's own error is raised, not hidden
        g(torch.ones(2, 3), torch.ones(5, 4))
    assert not isinstance(err.value, torch._dynamo.exc.BackendCompilerFailed) and g.state == "ok"


@pytest.mark.usefixtures("inductor_kernels")
def test_fusable_retries_once_after_an_environment_failure(caplog):
    """A first compilation that fails with an ``OSError`` in its chain (a missing file or program, as the early
    compilation's ``FileNotFoundError: '12'`` on the H200) runs the eager math and compiles again at the next call;
    a second such failure, or a failure of another kind, is for good."""
    import logging

    import torch._dynamo

    torch._dynamo.reset()
    calls = []

    def flaky(gm, example_inputs):
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", "12")
        return gm.forward

    f = fused.Fusable(fused._rms_norm, "test norm", devices=("cpu",), backend=flaky)
    w, x = torch.ones(8), torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, logger="models.kernels"):
        assert torch.equal(f(x, w, 1e-6), fused._rms_norm(x, w, 1e-6))
    assert f.state == "new" and f.retried and "compiling again at the next call" in caplog.text
    assert torch.equal(f(x, w, 1e-6), fused._rms_norm(x, w, 1e-6)) and f.state == "ok" and len(calls) == 2

    torch._dynamo.reset()

    def broken(gm, example_inputs):
        raise FileNotFoundError(2, "No such file or directory", "12")

    g = fused.Fusable(fused._rms_norm, "test norm 2", devices=("cpu",), backend=broken)
    g(x, w, 1e-6)
    g(x, w, 1e-6)
    assert g.state == "failed"                         # retried once, then eager for good
    torch._dynamo.reset()

    def wrong(gm, example_inputs):
        raise RuntimeError("not an environment failure")

    h = fused.Fusable(fused._rms_norm, "test norm 3", devices=("cpu",), backend=wrong)
    h(x, w, 1e-6)
    assert h.state == "failed" and not h.retried


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm_equals_layer_norm_of_the_sum(dtype):
    """The fused residual add + LayerNorm is the library's two steps: the sum in the model dtype, then
    ``F.layer_norm`` of that rounded sum (bit-identical on the CPU, where it runs eagerly)."""
    torch.manual_seed(0)
    x, r = torch.randn(2, 7, 48, dtype=dtype) * 2, torch.randn(2, 7, 48, dtype=dtype) * 5
    w, b = torch.randn(48, dtype=dtype), torch.randn(48, dtype=dtype)
    s, normed = fused.add_layer_norm(x, r, w, b, 1e-6)
    assert s.dtype == normed.dtype == dtype
    assert torch.equal(s, r + x)
    assert torch.equal(normed, torch.nn.functional.layer_norm(x + r, (48,), w, b, 1e-6))
    _, no_affine = fused.add_layer_norm(x[0], r[0], None, None, 1e-5)
    assert torch.equal(no_affine, torch.nn.functional.layer_norm(x[0] + r[0], (48,), eps=1e-5))


def test_gelu_tanh_linear_is_cuda_only():
    """On the CPU ``torch._addmm_activation(use_gelu=True)`` is the erf GELU, not the tanh one the VideoLLaMA3 vision
    MLP uses (what makes the epilogue CUDA-only); :func:`fused.gelu_tanh_linear` refuses CPU tensors."""
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 8) * 3, torch.randn(6, 8), torch.randn(6)
    lin = torch.nn.functional.linear(x, w, b)
    cpu = torch._addmm_activation(b, x, w.t(), use_gelu=True)
    assert torch.equal(cpu, torch.nn.functional.gelu(lin))
    assert not torch.equal(cpu, torch.nn.functional.gelu(lin, approximate="tanh"))
    with pytest.raises(ValueError, match="CUDA only"):
        fused.gelu_tanh_linear(x, w, b)


def test_the_gelu_epilogue_goes_with_kernels_inductor_only():
    """The vision MLP's fc1 + tanh GELU as one epilogue GEMM rounds once where the library rounds twice, so only the
    mode that rounds once (``inductor``) takes it; ``triton`` (default) and ``eager`` keep the library's math."""
    old = fused.set_mode("triton")
    try:
        got = {}
        for mode in fused.KERNEL_MODES:
            fused.set_mode(mode)
            got[mode] = fused.gelu_epilogue_on()
        assert got == {"triton": False, "inductor": True, "eager": False}
    finally:
        fused.Fusable.mode = old


def _tiny_video_inputs(seed: int = 0, frames: int = 2, h: int = 4, w: int = 4):
    """Random patches of one video grid ``(frames, h, w)`` (merge size 2), as the vision model takes them."""
    g = torch.Generator().manual_seed(seed)
    px = torch.randn(frames * h * w, 3 * 14 * 14, generator=g)
    return px, torch.tensor([[frames, h, w]]), torch.tensor([2])


def _vision_fused_modules(vision):
    layers = [m for m in vision.modules() if type(m).__name__ in forwards.VISION_LAYER_CLASSES]
    mlps = [m for m in vision.modules() if type(m).__name__ in forwards.VISION_MLP_CLASSES]
    return layers, mlps


def test_vision_encoder_fused_forwards_equal_library_on_cpu(tiny_vlm, monkeypatch):
    """The bound VideoLLaMA3 vision encoder-layer and MLP forwards give exactly the library's outputs on the CPU
    (fp32), layer by layer and for the whole vision model, and the add ending each layer's MLP block is fused with
    the next layer's ``layer_norm1`` (2 L - 1 fused add+LayerNorm calls per encode)."""
    vision = tiny_vlm.model.model.vision_model
    layers, mlps = _vision_fused_modules(vision)
    assert len(layers) == len(mlps) == vision.config.num_hidden_layers == 2
    assert all(m.forward.__func__ is forwards._vision_layer_forward for m in layers)
    assert all(m.forward.__func__ is forwards._vision_mlp_forward for m in mlps)
    assert layers[0].__dict__[forwards._NEXT_NORM] is layers[1].layer_norm1 and forwards._NEXT_NORM not in layers[1].__dict__
    px, thw, ms = _tiny_video_inputs()
    torch.manual_seed(1)
    x = torch.randn(32, vision.config.hidden_size)
    seg = torch.tensor([0, 16, 32], dtype=torch.int32)
    head_dim = vision.config.hidden_size // vision.config.num_attention_heads
    pos = (torch.randn(32, head_dim), torch.randn(32, head_dim))
    with torch.no_grad():
        for layer, mlp in zip(layers, mlps):
            assert torch.equal(mlp(x), type(mlp).forward(mlp, x))
            assert torch.equal(mlp(x.view(2, 16, -1)), type(mlp).forward(mlp, x.view(2, 16, -1)))
            got = layer(x, cu_seqlens=seg, position_embeddings=pos)
            assert torch.equal(got, type(layer).forward(layer, x, cu_seqlens=seg, position_embeddings=pos))
        forwards.fuse(vision, False)
        want = vision(pixel_values=px, grid_thw=thw, merge_sizes=ms).last_hidden_state
        forwards.fuse(vision, True)
        calls = []
        original = fused.add_layer_norm
        monkeypatch.setattr(forwards, "add_layer_norm", lambda *a: calls.append(1) or original(*a))
        got = vision(pixel_values=px, grid_thw=thw, merge_sizes=ms).last_hidden_state
    assert len(calls) == 2 * len(layers) - 1
    assert torch.equal(got, want)


def test_vision_layer_hand_off_is_checked():
    """The next layer's normalised rows ride on the layer output only while it is unchanged: an in-place change or
    another LayerNorm gets ``None`` (the layer normalises itself); under autograd nothing is handed off."""
    from transformers.models.video_llama_3.configuration_video_llama_3 import VideoLlama3VisionConfig
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionEncoder

    cfg = VideoLlama3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    enc = VideoLlama3VisionEncoder(cfg).eval()
    assert forwards.fuse(enc, True) == 4
    x = torch.randn(8, 32)
    pos = (torch.randn(8, 16), torch.randn(8, 16))
    seg = torch.tensor([0, 8], dtype=torch.int32)
    first, second = enc.layers
    with torch.no_grad():
        out = first(x, cu_seqlens=seg, position_embeddings=pos)
        assert torch.equal(forwards._take_normed(out, second.layer_norm1), second.layer_norm1(out))
        assert forwards._take_normed(out, second.layer_norm1) is None                      # consumed
        out = first(x, cu_seqlens=seg, position_embeddings=pos)
        assert forwards._take_normed(out, first.layer_norm1) is None                       # not that norm's
        out = first(x, cu_seqlens=seg, position_embeddings=pos)
        out.mul_(2)
        assert forwards._take_normed(out, second.layer_norm1) is None                      # modified in place
    out = first(x.requires_grad_(), cu_seqlens=seg, position_embeddings=pos)
    assert forwards._HANDOFF not in out.__dict__ and out.requires_grad
    assert forwards.fuse(enc, False) == 4


def test_fused_videollama3_keeps_video_logits_and_unbinds_on_cpu(tiny_vlm):
    """The whole tiny VideoLLaMA3 on a video prompt (vision encoder, projector, LLM) gives bit-identical logits with
    the fused kernels on and off on the CPU; off restores the library's forwards (the class functions, no links)."""
    cfg = tiny_vlm.model.config
    px, thw, ms = _tiny_video_inputs(seed=3)
    n_video = int(thw.prod() // ms[0] ** 2)
    g = torch.Generator().manual_seed(4)
    ids = torch.cat([torch.randint(0, 151643, (1, 5), generator=g), torch.full((1, n_video), cfg.video_token_id),
                     torch.randint(0, 151643, (1, 6), generator=g)], 1)
    vision = tiny_vlm.model.model.vision_model
    layers, mlps = _vision_fused_modules(vision)

    def logits():
        with torch.no_grad():
            return tiny_vlm.model(input_ids=ids, pixel_values_videos=px, video_grid_thw=thw,
                                  video_merge_sizes=ms).logits

    try:
        tiny_vlm.set_fused_kernels(False)
        for m in layers + mlps:
            assert "forward" not in m.__dict__ and m.forward.__func__ is type(m).forward
            assert forwards._NEXT_NORM not in m.__dict__
        ref = logits()
        tiny_vlm.set_fused_kernels(True)
        assert all("forward" in m.__dict__ for m in layers + mlps)
        got = logits()
    finally:
        tiny_vlm.set_fused_kernels(True)
    assert torch.equal(got, ref)
    assert forwards.fuse(vision, False) == len(layers) + len(mlps)
    assert all(m.forward.__func__ is type(m).forward for m in layers + mlps)
    tiny_vlm.set_fused_kernels(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rope_on_token_rows_equals_the_library(dtype):
    """``fused_rope`` (what the patched ``apply_rotary_pos_emb`` calls on CUDA; eager here): q, k as the attention
    modules make them (transposed views of (B, S, H, d) projections) run as (B S, H, d) rows and come back as the
    same views, bit-identical to the library; other layouts take the 4-D kernel, also identical."""
    from transformers.models.qwen2 import modeling_qwen2 as mq

    original = forwards._ROPE_ORIGINAL.get(mq.__name__, mq.apply_rotary_pos_emb)
    torch.manual_seed(0)
    for b, s in ((1, 37), (3, 5), (3, 1)):                        # prefill, suffix, decode step
        q = torch.randn(b, s, 4, 16, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, 2, 16, dtype=dtype).transpose(1, 2)
        cos, sin = torch.randn(b, s, 16, dtype=dtype), torch.randn(b, s, 16, dtype=dtype)
        for got, want, x in zip(fused.fused_rope(q, k, cos, sin), original(q, k, cos, sin), (q, k)):
            assert torch.equal(got, want) and got.shape == x.shape and got.stride() == x.stride()
        qc, kc = q.contiguous(), k.contiguous()                   # not a transposed view: the 4-D kernel
        for got, want in zip(fused.fused_rope(qc, kc, cos, sin), original(qc, kc, cos, sin)):
            assert torch.equal(got, want)


@pytest.mark.usefixtures("inductor_kernels")
def test_llm_call_shapes_compile_one_graph_per_function(monkeypatch):
    """Prefill (1, L), question suffix (Q, n) and decode step (Q, 1) shapes reach RMSNorm, the SiLU gate and the
    rotary as (N, D) rows: one graph each (compiled here with a counting backend on the CPU); the 4-D rotary
    needed three (size-1 batch and size-1 sequence are specialized)."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs: dict[str, int] = {}

    def counting(name):
        def backend(gm, example_inputs):
            graphs[name] = graphs.get(name, 0) + 1
            return gm.forward
        return backend

    for name in ("rms_norm", "silu_mul", "rope_rows", "rope"):
        f = getattr(fused, name)
        monkeypatch.setattr(f, "devices", ("cpu",))
        monkeypatch.setattr(f, "backend", counting(name))
        monkeypatch.setattr(f, "_compiled", None)
        monkeypatch.setattr(f, "state", "new")
    w = torch.ones(24)
    for b, s in ((1, 37), (3, 5), (3, 1), (1, 41), (2, 1)):
        x = torch.randn(b, s, 24)
        assert torch.equal(fused._on_rows(lambda r: fused.rms_norm(r, w, 1e-6), x), fused._rms_norm(x, w, 1e-6))
        g, u = torch.randn(b, s, 40), torch.randn(b, s, 40)
        assert torch.equal(fused._on_rows(fused.silu_mul, g, u), fused._silu_mul(g, u))
        q = torch.randn(b, s, 4, 16).transpose(1, 2)
        k = torch.randn(b, s, 2, 16).transpose(1, 2)
        cos, sin = torch.randn(b, s, 16), torch.randn(b, s, 16)
        for got, want in zip(fused.fused_rope(q, k, cos, sin), fused._rope(q, k, cos, sin)):
            assert torch.equal(got, want)
        fused.rope(q.contiguous(), k.contiguous(), cos, sin)     # the 4-D kernel, for comparison
    assert graphs["rms_norm"] == graphs["silu_mul"] == graphs["rope_rows"] == 1
    assert graphs["rope"] == 3
    torch._dynamo.reset()


@pytest.mark.usefixtures("inductor_kernels")
@pytest.mark.parametrize("loaded_in_inference_mode", [False, True])
def test_early_compilation_makes_the_graphs_the_model_then_calls(tiny_vl3_dir, monkeypatch, loaded_in_inference_mode):
    """``models.videollama3.warm.compile_fused_kernels`` (run in a thread, from the config alone, in the grad mode
    the model will run in) compiles one graph per fused kernel; the model's own forwards afterwards (vision encode,
    LLM prefill-, suffix- and decode-shaped calls, under ``torch.inference_mode`` as Lightning's predict loop)
    compile nothing more: the same guards, whether the weights were loaded outside inference mode or inside it (as
    ``BudgetedQA.on_predict_start`` loads them in the predict loop; the stand-in weights follow,
    ``inference_weights``). Compiled here with a counting backend on the CPU."""
    import threading

    import torch._dynamo

    from datamodules.decode import decode_video
    from models import vision_attention
    from models.videollama3 import warm
    from tests.conftest import MEDIA

    from models.videollama3 import BudgetedVideoLlama3

    tiny_vlm = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir)
    if loaded_in_inference_mode:   # moved inside inference mode (the CLI's .to("cuda")): new, inference tensors
        with torch.inference_mode():
            tiny_vlm.model.to(torch.float64).to(torch.float32)
    torch._dynamo.reset()
    graphs: dict[str, int] = {}

    def counting(name):
        def backend(gm, example_inputs, **options):   # (add+LayerNorm passes Inductor options)
            graphs[name] = graphs.get(name, 0) + 1
            return gm.forward
        return backend

    from models.videollama3 import prepare_budgets, shared_prefix

    kernels = {"rms_norm": fused.rms_norm, "silu_mul": fused.silu_mul, "rope_rows": fused.rope_rows,
               "add_layer_norm": fused.add_layer_norm, "vision_rotary": vision_attention.fused_rotary_qk,
               "merge": shared_prefix._suffix_and_merge}
    for name, f in kernels.items():
        monkeypatch.setattr(f, "devices", ("cpu",))
        monkeypatch.setattr(f, "backend", counting(name))
        monkeypatch.setattr(f, "_compiled", None)
        monkeypatch.setattr(f, "state", "new")
    done = []
    thread = threading.Thread(target=lambda: done.append(warm.compile_fused_kernels(
        tiny_vlm.model.config, "cpu", tiny_vlm.dtype, inference=True, inference_weights=loaded_in_inference_mode)))
    thread.start()
    thread.join()
    assert len(done[0]) == 6 and graphs == {name: 1 for name in kernels}
    dec = decode_video(MEDIA / "cockatoo.mp4", 1024)
    frames = dec.frames[:3]
    lm = tiny_vlm.model.model.language_model
    d = lm.config.hidden_size
    with torch.inference_mode():
        tiny_vlm.encode(frames, 64)
        for b, s in ((1, 23), (3, 5), (3, 1)):
            lm(inputs_embeds=torch.randn(b, s, d))
        # a video's batched answer: the decode step's shared-prefix merge (3 questions) hits the early graph
        bi = next(iter(prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [128])))
        tiny_vlm.answer_batched(bi.prompt, ["Animal?\nA. A dog.\nB. A bird.", "Colour?\nA. White.", "Where?\nA. Here."],
                                3, decode="static")
    assert graphs == {name: 1 for name in kernels}
    torch._dynamo.reset()
