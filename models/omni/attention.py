"""Attention kernels the lockstep batch runner installs around its calls: the towers' chunked attention as one
batched SDPA call per chunk length, and the LLM prefill's lower-right causal SDPA (flash kernel) on CUDA.

Both are context managers that patch and restore (``_batched_chunk_attention`` on one thinker's tower modules,
``_lower_right_prefill`` on transformers' attention-function interface, counted per thread); the math is the
library's (module docstring of ``models/omni/batch.py``: bit-identical towers, LLM states equal to fp32 rounding).
"""
from __future__ import annotations

import logging
import threading
import types
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from models.vision_attention import chunk_lengths, fused_rotary_qk, sdpa_without_cudnn

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------- batched chunk attention
def _chunk_attention(module, q, k, v, cu_seqlens) -> torch.Tensor:
    """Non-causal attention inside each ``cu_seqlens`` chunk of (1, H, S, d) q/k/v, one call per chunk length.

    Returns (S, H * d) in sequence order, as the library's per-chunk loop does (same attention function)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import eager_attention_forward

    fn = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    with sdpa_without_cudnn(q.device):
        return _chunk_attention_calls(fn, module, q, k, v, chunk_lengths(cu_seqlens))


def _chunk_attention_calls(fn, module, q, k, v, lengths: list[int]) -> torch.Tensor:
    _, h, s, d = q.shape
    if all(n == lengths[0] for n in lengths):  # all chunks equal (the usual case): views, one call, no Python loop
        qb, kb, vb = (t[0].view(h, len(lengths), lengths[0], d).transpose(0, 1) for t in (q, k, v))
        o = fn(module, qb, kb, vb, attention_mask=None, scaling=module.scaling, dropout=0.0, is_causal=False)[0]
        return o.reshape(s, -1)  # o: (n_chunks, L, H, d), chunks in sequence order
    qs, ks, vs = (t[0].split(lengths, dim=1) for t in (q, k, v))  # each (H, L_i, d)
    outs: list[torch.Tensor | None] = [None] * len(lengths)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    for n, ids in by_len.items():
        qb, kb, vb = (torch.stack([parts[i] for i in ids]) for parts in (qs, ks, vs))
        o = fn(module, qb, kb, vb, attention_mask=None, scaling=module.scaling, dropout=0.0, is_causal=False)[0]
        for j, i in enumerate(ids):  # o: (n_chunks, L, H, d)
            outs[i] = o[j]
    return torch.cat(outs, 0).reshape(s, -1)


def _vision_attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kw):
    # the library's float32 vision rotary (``apply_rotary_pos_emb_vision``), as one fused kernel on CUDA
    # (``models.vision_attention.rotary_qk``: bit-identical in eager, which is what runs on the CPU)
    n = hidden_states.shape[0]
    q = self.q(hidden_states).reshape(n, self.num_heads, -1)
    k = self.k(hidden_states).reshape(n, self.num_heads, -1)
    v = self.v(hidden_states).reshape(n, self.num_heads, -1)
    cos, sin = position_embeddings
    q, k = fused_rotary_qk(q, k, cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float())
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return self.proj(_chunk_attention(self, q, k, v, cu_seqlens).contiguous())


def _audio_attention_forward(self, hidden_states, cu_seqlens, max_seqlen=None, **kw):
    n = hidden_states.shape[0]
    q, k, v = (p(hidden_states).reshape(n, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
               for p in (self.q_proj, self.k_proj, self.v_proj))
    return self.out_proj(_chunk_attention(self, q, k, v, cu_seqlens).contiguous())


def _per_sample_conv_forward(self, x):
    return torch.cat([type(self).forward(self, x[i: i + 1]) for i in range(x.shape[0])])


@contextmanager
def _batched_chunk_attention(thinker):
    """Inside: the towers' per-chunk attention loops become one SDPA call per chunk length (flash-attention
    implementations, which already take ``cu_seqlens``, are left alone)."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as mq

    patched = []
    for m in ([] if "flash" in str(thinker.config._attn_implementation) else thinker.modules()):
        if isinstance(m, mq.Qwen2_5OmniVisionAttention):
            m.forward = types.MethodType(_vision_attention_forward, m)
        elif isinstance(m, mq.Qwen2_5OmniAudioAttention):
            m.forward = types.MethodType(_audio_attention_forward, m)
        else:
            continue
        patched.append(m)
    for conv in (thinker.model.audio_tower.conv1, thinker.model.audio_tower.conv2):
        # one conv call per audio chunk: a batched CPU conv (oneDNN) may round differently from a batch of one,
        # and these calls are few (2 per stream and row)
        conv.forward = types.MethodType(_per_sample_conv_forward, conv)
        patched.append(conv)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


# ----------------------------------------------------------------------------------- LLM prefill attention
_LOWER_RIGHT_STATE = {"failed": False, "no_native_gqa": False, "installed": 0}
_LOWER_RIGHT_LOCK = threading.Lock()
_LOWER_RIGHT_THREAD = threading.local()     # depth of _lower_right_prefill contexts in this thread


def lower_right_causal_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None, force: bool = False,
                            **kwargs):
    """transformers' SDPA attention function for a causal prefill of ``q`` new tokens on top of a cache, with the
    mask as what it is: lower-right causal (every cached key visible, the new tokens causal among themselves).

    transformers passes such a prefill an explicit (B, 1, q, kv) boolean mask (its SDPA integration can only use
    ``is_causal`` when q == kv), which sends SDPA to the masked memory-efficient kernel after copying the keys and
    values once per query group. ``torch.nn.attention.bias.causal_lower_right`` lets SDPA take its flash kernel
    instead (same math); where the flash kernel applies it is called directly on the un-repeated keys/values
    (FlashAttention-2 reads each key/value head for its query group, and its causal flag is bottom-right aligned).
    Used by ``BatchedOmniRunner`` around its own LLM calls, whose caches hold exactly the
    visible context (no padding, no sliding-window layers), so the ignored mask is that pattern.

    Args:
        module: the text attention module (``is_causal``, ``num_key_value_groups``).
        query: (B, H, q, d); key, value: (B, H_kv, kv, d) with kv >= q.
        attention_mask: the library's mask, ignored on the CUDA path (see above).
        force: take the lower-right path on any device (tests; on the CPU SDPA materialises the same mask).

    Returns:
        ``((B, q, H, d) attention output, None)``, as transformers' attention functions.

    Other calls run ``sdpa_attention_forward`` unchanged: from a thread not inside :func:`_lower_right_prefill`
    (the switch is process-wide), a non-causal module, one query, a sliding window, not CUDA (unless ``force``),
    under ``torch.compile`` (dynamo cannot build the bias and would run the whole text model eagerly), or after a
    first failure of the lower-right call (other than running out of memory, which is raised).
    """
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    def library():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)

    q_len, kv_len = query.shape[2], key.shape[2]
    if (not force and (getattr(_LOWER_RIGHT_THREAD, "depth", 0) == 0 or query.device.type != "cuda")
            or _LOWER_RIGHT_STATE["failed"] or torch.compiler.is_compiling() or not getattr(module, "is_causal", False)
            or q_len < 2 or kv_len < q_len or kwargs.get("sliding_window") is not None):
        return library()
    groups = getattr(module, "num_key_value_groups", 1)
    if not _LOWER_RIGHT_STATE["no_native_gqa"] and _native_gqa_flash(query, key, value, dropout):
        try:
            # FlashAttention-2's causal flag is bottom-right aligned (what ``causal_lower_right`` dispatches to),
            # and it reads each key/value head for its query group itself: no per-group copies
            out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal=True,
                                                                     scale=scaling)[0]
            return out.transpose(1, 2).contiguous(), None
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # a flash build without native grouped heads: repeat the keys/values below
            log.warning("flash on un-repeated keys/values failed (%s); repeating them", e)
            _LOWER_RIGHT_STATE["no_native_gqa"] = True
    try:
        k, v = (repeat_kv(key, groups), repeat_kv(value, groups)) if groups > 1 else (key, value)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=causal_lower_right(q_len, kv_len),
                                             dropout_p=dropout, scale=scaling)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:  # a PyTorch without this dispatch: the library's masked call, for good
        log.warning("lower-right causal SDPA failed (%s); using the library's masked SDPA", e)
        _LOWER_RIGHT_STATE["failed"] = True
        return library()
    return out.transpose(1, 2).contiguous(), None


def _native_gqa_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float) -> bool:
    """Whether the lower-right prefill may call the flash kernel directly on un-repeated keys/values: CUDA, fp16 /
    bf16, no dropout, head size a multiple of 8 up to 256, query heads a multiple of key heads, and SDPA's own flash
    checks pass for these shapes (with ``enable_gqa``)."""
    if (query.device.type != "cuda" or query.dtype not in (torch.float16, torch.bfloat16) or dropout
            or query.shape[-1] % 8 or query.shape[-1] > 256 or query.shape[1] % key.shape[1]):
        return False
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    try:
        return bool(can_use_flash_attention(SDPAParams(query, key, value, None, 0.0, False, True)))
    except TypeError:  # a PyTorch whose SDPAParams has no enable_gqa: keep the repeat
        return False


@contextmanager
def _lower_right_prefill(lm, on: bool):
    """Inside: the ``sdpa`` attention function of transformers' interface is :func:`lower_right_causal_sdpa`
    for this thread's calls, when ``on`` and ``lm`` runs SDPA without sliding-window layers. The function is
    installed by the first entry of any thread and removed by the last exit (a lock counts them); calls from
    threads outside such a context go to the library's function unchanged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = lm.config
    if not on or cfg._attn_implementation != "sdpa" or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        yield
        return
    with _LOWER_RIGHT_LOCK:
        if _LOWER_RIGHT_STATE["installed"] == 0:
            _LOWER_RIGHT_STATE["saved"] = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
            ALL_ATTENTION_FUNCTIONS["sdpa"] = lower_right_causal_sdpa
        _LOWER_RIGHT_STATE["installed"] += 1
    _LOWER_RIGHT_THREAD.depth = getattr(_LOWER_RIGHT_THREAD, "depth", 0) + 1
    try:
        yield
    finally:
        _LOWER_RIGHT_THREAD.depth -= 1
        with _LOWER_RIGHT_LOCK:
            _LOWER_RIGHT_STATE["installed"] -= 1
            if _LOWER_RIGHT_STATE["installed"] == 0:
                saved = _LOWER_RIGHT_STATE.pop("saved")
                if saved is None:
                    del ALL_ATTENTION_FUNCTIONS["sdpa"]
                else:
                    ALL_ATTENTION_FUNCTIONS["sdpa"] = saved
