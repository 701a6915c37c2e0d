"""models/fused.py: the fused forwards hold exactly the library's math (bit-identical where they run eagerly, the
CPU), bind and unbind cleanly, and the patched rotary is the library's function off CUDA."""
import pytest
import torch

from models import fused


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
    original = fused._ROPE_ORIGINAL.get(mq.__name__, mq.apply_rotary_pos_emb)
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
        assert fused.fuse(lm, False) == want_bound
        assert not any("forward" in m.__dict__ for m in lm.modules() if type(m).__name__ in fused.NORM_CLASSES)
        ref = tiny_vlm.model(input_ids=ids).logits
        assert fused.fuse(lm, True) == want_bound
        assert all("forward" in m.__dict__ for m in lm.modules()
                   if type(m).__name__ in fused.NORM_CLASSES | fused.MLP_CLASSES)
        from transformers.models.qwen2 import modeling_qwen2 as mq
        assert mq.apply_rotary_pos_emb.__wrapped__ is fused._ROPE_ORIGINAL[mq.__name__]
        got = tiny_vlm.model(input_ids=ids).logits
    finally:
        tiny_vlm.set_fused_kernels(True)
    assert torch.equal(got, ref)


def test_fuse_covers_the_omni_thinker(tmp_path):
    """The Qwen2.5-Omni thinker's LLM and vision blocks are bound (their MLPs are gated SiLU); the audio tower's are
    not touched (no RMSNorm / gated MLP there)."""
    from models.tiny_omni import build_tiny_omni
    from models.omni import OmniThinkerRunner

    runner = OmniThinkerRunner(build_tiny_omni(tmp_path / "omni"), layer=-1)
    model = runner.thinker.model
    text, vision = model.language_model, model.visual
    n_text = sum(1 for m in text.modules() if "forward" in m.__dict__)
    n_vision = sum(1 for m in vision.modules() if "forward" in m.__dict__)
    assert n_text == 3 * text.config.num_hidden_layers + 1
    assert n_vision >= 3 * len(vision.blocks)
    assert not any("forward" in m.__dict__ for m in model.audio_tower.modules())
    assert fused.fuse(runner.thinker, False) == n_text + n_vision


@pytest.mark.parametrize("bias", [False, True])
def test_padded_gate_up_equals_the_library_mlp(bias):
    """A gated MLP with an intermediate size off the 8-element alignment, zero-padded to 64 with gate and up in one
    GEMM (what runs on CUDA), gives the library's values; the padding is rebuilt when the weights change."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniMLP

    cfg = type("Cfg", (), {"hidden_size": 24, "intermediate_size": 37, "hidden_act": "silu"})()
    torch.manual_seed(0)
    mlp = Qwen2_5OmniMLP(cfg, bias=bias)
    x = torch.randn(5, 24)
    w, b, dw = fused._padded_gate_up(mlp, x.device)
    assert w.shape == (128, 24) and dw.shape == (24, 64) and (b is None) == (not bias)
    assert torch.count_nonzero(w[37:64]) == 0 and torch.count_nonzero(dw[:, 37:]) == 0
    want = Qwen2_5OmniMLP.forward(mlp, x)
    assert torch.allclose(fused._padded_mlp(mlp, x), want, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2)                   # in place: a new weight version
    assert torch.allclose(fused._padded_mlp(mlp, x), Qwen2_5OmniMLP.forward(mlp, x), atol=1e-6, rtol=1e-6)


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
