"""Compile the fused kernels of a VideoLLaMA3 checkpoint while its weights load (the first video's warm-up).

The fused kernels (:mod:`models.kernels`, :mod:`models.vision_attention`) are ``torch.compile`` graphs built at
their first call, which is the first video's predict step: on the H200, 6 graphs and about 20 s of Inductor work
(``bench/qa_step_profile.py``). Their shapes depend only on the checkpoint's config (hidden sizes, heads, head dims,
norm epsilons, dtype), with the token/frame counts dynamic, so they can be compiled from the config alone, on
stand-in tensors, in a background thread that runs while ``from_pretrained`` reads the weights and the DataLoader
workers decode the first videos. :func:`start` begins it; the caller joins the thread before its first forward, so
the first step only waits for what is not done yet (nothing is ever computed twice: a graph compiled here is the
one the model calls, the same guards).

Legend: N rows (dynamic), D LLM hidden size, I LLM intermediate size, H / H_kv query / key-value heads, d head dim,
C vision hidden size, h vision heads, e vision head dim.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def compile_fused_kernels(config, device: torch.device | str, dtype: torch.dtype, inference: bool = False,
                          inference_weights: bool | None = None) -> list[str]:
    """Call every fused kernel the VideoLLaMA3 model will call, on stand-in tensors of the model's fixed sizes
    (rows dynamic, as the kernels mark them), so each graph is compiled now (on a device the kernels compile for;
    elsewhere they run eagerly, and this is a few small eager calls).

    Args:
        config: a ``VideoLlama3Config`` (its ``text_config`` and ``vision_config`` give the fixed sizes).
        device: the model's device.
        dtype: the model's dtype.
        inference: run under ``torch.inference_mode`` (as Lightning's predict loop runs the model: inference
            tensors are guarded apart from plain ones, so the graphs must be made in the mode they will be called
            in), else under ``torch.no_grad``.
        inference_weights: the model's weights are inference tensors (loaded, or moved to the device, inside
            ``torch.inference_mode``, as ``BudgetedQA.on_predict_start`` does in Lightning's predict loop);
            default: ``inference``.

    Returns:
        The names of the kernels called (the shared-prefix merge of the decode step is left to its first call: its
        shapes come from the questions).
    """
    from ..kernels import add_layer_norm, rms_norm, rope_rows, silu_mul
    from ..vision_attention import fused_rotary_qk

    device = torch.device(device)
    text, vision = config.get_text_config(), config.vision_config
    d_model, inter = text.hidden_size, text.intermediate_size
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or d_model // heads
    c, v_heads = vision.hidden_size, vision.num_attention_heads
    v_dim = c // v_heads
    rows, frames, patches = 19, 3, 40   # > 1: sizes 0 and 1 would be specialized
    # the weights as the model holds them (parameters; inference tensors when loaded in inference mode), the
    # activations in the mode the model runs in (inference tensors carry another dispatch key set, which is guarded)
    with torch.inference_mode(inference if inference_weights is None else inference_weights):
        weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype), requires_grad=False)
        ln_w, ln_b = (torch.nn.Parameter(torch.ones(c, device=device, dtype=dtype), requires_grad=False)
                      for _ in range(2))
    with torch.inference_mode() if inference else torch.no_grad():
        rms_norm(torch.randn(rows, d_model, device=device, dtype=dtype), weight, float(text.rms_norm_eps))
        silu_mul(*(torch.randn(rows, inter, device=device, dtype=dtype) for _ in range(2)))
        rope_rows(torch.randn(rows, heads, head_dim, device=device, dtype=dtype),
                  torch.randn(rows, kv_heads, head_dim, device=device, dtype=dtype),
                  *(torch.randn(rows, head_dim, device=device, dtype=dtype) for _ in range(2)))
        add_layer_norm(*(torch.randn(rows, c, device=device, dtype=dtype) for _ in range(2)), ln_w, ln_b,
                       float(vision.layer_norm_eps))
        fused_rotary_qk(*(torch.randn(frames, patches, v_heads, v_dim, device=device, dtype=dtype) for _ in range(2)),
                        *(torch.randn(patches, 1, v_dim, device=device) for _ in range(2)))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ["RMSNorm", "SiLU*up", "rotary (rows)", "add+LayerNorm", "vision rotary"]


def start(model_path: str | Path, device: torch.device | str, dtype: torch.dtype,
          inference: bool | None = None) -> threading.Thread | None:
    """Start :func:`compile_fused_kernels` for the checkpoint at ``model_path`` in a daemon thread (``None`` when
    there is nothing to compile: not CUDA, or a config transformers' ``VideoLlama3Config`` cannot read, such as the
    original VideoLLaMA3 layout). ``inference``: the grad mode the model will be called in (default: the calling
    thread's, ``torch.is_inference_mode_enabled()``; the thread's own mode is not inherited). A failure in the
    thread is logged; the kernels then compile at their first call as usual (or fall back to eager,
    :class:`models.kernels.Fusable`)."""
    if torch.device(device).type != "cuda":
        return None
    if inference is None:
        inference = torch.is_inference_mode_enabled()
    try:
        from transformers import VideoLlama3Config

        config = VideoLlama3Config.from_pretrained(str(model_path))
    except Exception as e:  # noqa: BLE001 - an unreadable config only means no early compilation
        log.info("no early kernel compilation for %s (%s)", model_path, e)
        return None

    def run() -> None:
        try:
            compile_fused_kernels(config, device, dtype, inference)
        except Exception as e:  # noqa: BLE001 - the kernels compile at their first call instead
            log.warning("early compilation of the fused kernels failed (%s); they compile at their first call", e)

    thread = threading.Thread(target=run, name="fused-kernel-compile", daemon=True)
    thread.start()
    return thread
