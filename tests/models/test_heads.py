"""Turn heads: shapes, causality (row i ignores rows after i) and the temporal heads' context length."""
import pytest
import torch

from models.heads import HEAD_TYPES, CausalConvHead, build_head


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_shapes_and_causality(head_type):
    torch.manual_seed(0)
    head = build_head(head_type, in_dim=16, num_outputs=11, hidden_dim=32, num_layers=2, context_rows=6,
                      dropout=0.0).eval()
    x = torch.randn(3, 40, 16)  # (B, T, D)
    y = head(x)
    assert y.shape == (3, 40, 11)
    for i in (0, 7, 25, 39):
        x2 = x.clone()
        x2[:, i + 1:] = torch.randn_like(x2[:, i + 1:]) * 10  # change every row after i
        y2 = head(x2)
        torch.testing.assert_close(y2[:, : i + 1], y[:, : i + 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_type", ["causal_conv", "causal_attention"])
def test_context_length(head_type):
    torch.manual_seed(0)
    ctx = 5
    head = build_head(head_type, in_dim=8, num_outputs=3, hidden_dim=16, num_layers=1, context_rows=ctx,
                      dropout=0.0).eval()
    x = torch.randn(1, 30, 8)
    y = head(x)
    i = 20
    x2 = x.clone()
    x2[:, : i - ctx + 1] += 5 * torch.randn_like(x2[:, : i - ctx + 1])  # rows outside the window of row i
    torch.testing.assert_close(head(x2)[:, i], y[:, i])
    x3 = x.clone()
    x3[:, i - ctx + 1] += 5 * torch.randn_like(x3[:, i - ctx + 1])  # oldest row inside the window
    assert not torch.allclose(head(x3)[:, i], y[:, i])


def test_conv_receptive_field_and_errors():
    for ctx, layers in ((1, 1), (10, 2), (10, 3), (25, 4)):
        assert sum(k - 1 for k in CausalConvHead(4, 2, 8, layers, ctx).kernels) == ctx - 1
    with pytest.raises(ValueError):
        build_head("transformer", 4, 2)
    with pytest.raises(ValueError):
        CausalConvHead(4, 2, context_rows=0)
