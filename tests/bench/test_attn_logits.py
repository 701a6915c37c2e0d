"""bench/attn_logits.py: the flash setting is skipped with its reason where it cannot run; two backends that compute
the same attention (eager vs SDPA, float32 on the CPU) give the same logits up to float rounding."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import MEDIA


def test_flash_is_skipped_with_its_reason(monkeypatch):
    from bench import attn_logits

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real(n, *a))
    assert attn_logits.unavailable("flash_attention_2", cuda=True) == "the flash_attn package is not installed"
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "flash_attn" else real(n, *a))
    assert attn_logits.unavailable("flash_attention_2", cuda=False) == "flash_attention_2 needs CUDA"
    assert attn_logits.unavailable("flash_attention_2", cuda=True) is None
    assert attn_logits.unavailable("sdpa", cuda=False) is None
    # the seeds' setting loads the whole model with the kernel (vision attention None: the LLM's)
    assert attn_logits.SETTINGS["flash_attention_2"] == ("flash_attention_2", None)


@pytest.mark.slow
def test_eager_and_sdpa_logits_agree_on_the_tiny_model(tiny_vl3_dir):
    from bench import attn_logits

    res = attn_logits.compare(str(tiny_vl3_dir), ["sdpa", "eager"], MEDIA / "cockatoo.mp4", 128, device="cpu")
    sdpa, eager = res["rows"]
    assert (sdpa["logits_max_abs"], sdpa["vision_max_abs"], sdpa["argmax_agree"]) == (0.0, 0.0, 1.0)
    assert eager["seq_len"] == sdpa["seq_len"] and eager["argmax_agree"] == 1.0
    assert 0.0 < eager["logits_max_abs"] < 1e-3          # different kernels, float32 rounding only
