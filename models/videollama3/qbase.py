"""The seeds' "qbase" token compressor: OnlineLong's ``TransformerDecoderFlatCompressor``, at inference.

Legend: B windows (compressed groups), L_b encoder rows of window b (frames × h_b × w_b), N = sum L_b, K learned
queries (``num_queries``; 64 in the seeds), C the vision encoder width, H heads, hd = C / H.

Seeds 000 and 001 call ``llm.inner.token_compressor`` as ``qb(feats, cu, [(hh, ww)] * len(plan.seg_lens))`` with
``qb.adaptive_segmentation = False``. That module is ``TransformerDecoderFlatCompressor`` of the VideoLLaMA3 fork
chicheng567/OnlineLong, ``videollama3/model/compressor.py``: the stored version with ``adaptive_segmentation``,
``match_encoder_scale`` and ``_build_cross_rotary_kv`` (search-index file id 69454226840; the mirrored branches'
``compressor.py``, last changed 56e666c "remove reconstruction part", predate it). Its forward, as computed here:

* ``query = self.query + pos_encoding`` -- a learned (1, K, C) parameter plus the fixed Vaswani sin/cos encoding of
  the flat index ``0..K-1`` (``PE[pos, 2i] = sin(pos / 10000^(2i/C))``, ``PE[pos, 2i+1] = cos(...)``), expanded to
  one copy per window;
* per ``TransformerDecoderLayer``: ``q = q + self_attn(layer_norm1(q))`` (non-causal among the window's K queries,
  no rotary), ``q = q + cross_attn(layer_norm2(q), kv)`` (the window's raw encoder rows as keys/values, not
  normalised; rotary on the keys only, queries at coordinate 0), ``q = q + mlp(layer_norm3(q))`` (``fc1``,
  tanh-GELU, ``fc2``); attention projections ``w_q/w_k/w_v/w_o`` bias-free, softmax scale ``hd ** -0.5``;
* the keys' rotary is ``_build_cross_rotary_kv``: a key at flat index ``j`` of a window with grid ``(h, w)`` has
  ``t = j // (h w)``, ``y = (j % (h w)) // w``, ``x = j % w``; ``inv_freq = 1 / 10000^(arange(0, hd, 2) / hd)``
  (``VisionRotaryEmbedding(dim=hd)``, D = hd / 2 frequencies) is split into bands ``d_t = D // 3``,
  ``d_h = (D - d_t) // 2``, ``d_w = D - d_t - d_h``; angles ``[t * band_t, y * band_h, x * band_w]``, applied as
  VideoLLaMA3's ``apply_rotary_pos_emb_vision`` (fp32, ``rotate_half`` pairing channel i with i + hd/2);
* ``match_encoder_scale`` (the fork's "Option A"): the output rows of the whole call are affinely mapped onto the
  per-channel mean / std of the call's whole KV input, ``(x - m) / s * ref_std + ref_mean``, then ``* out_gamma +
  out_beta`` (unbiased std, clamped at 1e-6, fp32). Because these statistics span the call, the caller passes every
  group of a plan in one call, as the seed does (:meth:`models.videollama3.model.BudgetedVideoLlama3.compress`).

The fork runs flash-attention varlen over ``compression_cu_seqlens``; here the windows are padded into batches and
attended with ``scaled_dot_product_attention`` and a key-padding mask (equal to a loop over windows within fp32
rounding, tested). Training-only parts are read from the config and checked, never run: KV pruning
(``token_prune_ratio``), the distribution loss (``distr_loss_weight``), the Gumbel boundary draw
(``segment_sample_tau``), dropout. The fork builds ``pos_encoding`` and ``inv_freq`` as fp32 buffers at
construction; here they are computed in fp32 at each call (a model cast to bf16 keeps fp32 angles, as the fork's
``from_pretrained(torch_dtype=bf16)`` does), and ``pos_encoding`` is cast to the query's dtype before the add, as
there.

Weights live in ``<checkpoint>/qbase/{config.json, model.safetensors}``: ``config.json`` is the fork's
``token_compressor_config`` dict and the weight names are the fork's (``query``, ``layers.N.{self_attn,cross_attn}.
{w_q,w_k,w_v,w_o}.weight``, ``layers.N.layer_norm{1,2,3}.{weight,bias}``, ``layers.N.mlp.fc{1,2}.{weight,bias}``,
``out_gamma``/``out_beta``), so a state dict the fork saved under ``model.token_compressor.`` loads with
``strict=True``.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from algorithms.errors import CheckpointError
from algorithms.segmentation import adaptive_segment_lengths

from ..kernels import host_to_device
from ..loading import reading_checkpoint
from ..vision_attention import sdpa_without_cudnn

SUPPORTED_COMPRESSOR_TYPES = ("transformer_decoder_flat",)
# the fork's other types (build_token_compressor): known, not run here
FORK_COMPRESSOR_TYPES = ("transformer_decoder", "transformer_decoder_flat", "transformer_decoder_flat+mamba",
                         "local_attn_conv", "siglip_ae")
# PretrainedConfig bookkeeping that a ``to_dict()`` of the fork's config carries; not compressor fields
_GENERIC_CONFIG_FIELDS = {
    "model_type", "transformers_version", "architectures", "_name_or_path", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "torch_dtype", "dtype", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "tie_word_embeddings", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size",
    "add_cross_attention", "tie_encoder_decoder", "id2label", "label2id", "problem_type", "tokenizer_class",
    "prefix", "bos_token_id", "pad_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "finetuning_task", "_attn_implementation_autoset", "_commit_hash",
}
_POSITION_BASE = 10000.0
_KV_CHUNK_ROWS = 1 << 15   # padded key rows per attention call (bounds the CPU math path's score tensor)


@dataclass
class TokenCompressorConfig:
    """The fork's ``Videollama3TokenCompressorConfig`` fields, with its defaults.

    Read and used: ``compressor_type`` (must be ``transformer_decoder_flat``), ``hidden_size`` (C, the vision
    width), ``intermediate_size``, ``num_layers``, ``num_attention_heads``, ``layer_norm_eps``, ``num_queries`` (K),
    ``match_encoder_scale``, ``adaptive_segmentation``, ``segment_target_frames``, ``segment_force_every``.
    Read and checked, inert at inference: ``attention_probs_dropout_prob`` (dropout), ``token_prune_ratio`` /
    ``token_prune_min_tokens`` (training-only KV pruning), ``distr_loss_weight`` / ``distr_loss_max_ref_tokens``
    (training-only loss), ``segment_sample_tau`` (training-only Gumbel draw). Read, unused by the flat compressor:
    ``compress_image_w`` / ``compress_image_h`` / ``window_size`` (grid compressors) and the ``stage2_*`` fields
    (the ``+mamba`` two-stage type), kept in ``extra``.
    """

    compressor_type: str = "transformer_decoder"
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_layers: int = 8
    num_attention_heads: int = 4
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-6
    compress_image_w: int = 16
    compress_image_h: int = 16
    window_size: int = 1
    num_queries: int = 32
    token_prune_ratio: float = 0.0
    token_prune_min_tokens: int = 0
    match_encoder_scale: bool = False
    distr_loss_weight: float = 0.0
    distr_loss_max_ref_tokens: int = 4096
    adaptive_segmentation: bool = False
    segment_target_frames: int = 4
    segment_force_every: int = 8
    segment_sample_tau: float = 0.0

    def __post_init__(self):
        self.check()

    def check(self, source: str = "token_compressor_config") -> None:
        """Raise ``ValueError`` naming ``source`` and the field for a value the flat compressor cannot run."""
        ct = self.compressor_type
        if ct not in SUPPORTED_COMPRESSOR_TYPES:
            known = "a type of the fork that this project does not run" if ct in FORK_COMPRESSOR_TYPES else \
                "an unknown type"
            raise ValueError(f"{source}: compressor_type={ct!r} is {known}; supported: "
                             f"{', '.join(SUPPORTED_COMPRESSOR_TYPES)} (the seeds' qbase)")
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_queries",
                     "segment_target_frames", "segment_force_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{source}: {name} must be a positive integer, got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{source}: hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if (self.hidden_size // self.num_attention_heads) % 2 or self.hidden_size % 2:
            raise ValueError(f"{source}: hidden_size and the head dim must be even (sin/cos encoding, rotary), got "
                             f"hidden_size={self.hidden_size}, heads={self.num_attention_heads}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{source}: layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        for name in ("attention_probs_dropout_prob", "token_prune_ratio", "distr_loss_weight", "segment_sample_tau"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{source}: {name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def from_dict(cls, d: dict, source: str = "token_compressor_config", *, default_hidden_size: int | None = None,
                  default_num_attention_heads: int | None = None) -> "TokenCompressorConfig":
        """The fork's ``build_token_compressor`` reading of a ``token_compressor_config`` dict.

        Legacy keys ``compress_w`` / ``compress_h`` become ``compress_image_w`` / ``compress_image_h`` (as the fork
        normalises them); a missing ``hidden_size`` / ``num_attention_heads`` takes ``default_*`` (the fork takes
        the model config's); ``stage2_*`` fields are accepted; PretrainedConfig bookkeeping is ignored; any other
        field is kept but warned about (the fork's PretrainedConfig accepts unknown fields silently).

        Raises:
            ValueError: a value the flat compressor cannot run (see :meth:`check`), naming ``source``.
        """
        d = dict(d)
        for old, new in (("compress_w", "compress_image_w"), ("compress_h", "compress_image_h")):
            if old in d and new not in d:
                d[new] = d.pop(old)
        if "hidden_size" not in d and default_hidden_size is not None:
            d["hidden_size"] = default_hidden_size
        if "num_attention_heads" not in d and default_num_attention_heads is not None:
            d["num_attention_heads"] = default_num_attention_heads
        own = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in own and k not in _GENERIC_CONFIG_FIELDS
                         and not k.startswith("stage2_") and k not in ("compress_w", "compress_h"))
        if unknown:
            warnings.warn(f"{source}: fields the fork's compressor config does not define, ignored: {unknown}",
                          stacklevel=2)
        cfg = cls.__new__(cls)
        for f in fields(cls):
            setattr(cfg, f.name, d.get(f.name, f.default))
        cfg.check(source)
        return cfg


def sinusoidal_position_encoding(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) fp32 additive sin/cos encoding of the flat index (the fork's
    ``_build_sinusoidal_position_encoding``: ``div_term = exp(arange(0, dim, 2) * (-log(10000) / dim))``)."""
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(_POSITION_BASE) / dim))
    pe = torch.zeros(num_positions, dim, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def cross_rotary_angles(window_rows: list[int], grid_hws: list[tuple[int, int]], head_dim: int,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """(N, head_dim // 2) fp32 rotary angles of every key row (the fork's ``_build_cross_rotary_kv``).

    Args:
        window_rows: L_b per window (a multiple of ``h_b * w_b``).
        grid_hws: ``(h_b, w_b)`` per window.
        head_dim: hd.

    Raises:
        ValueError: a window whose row count is not a multiple of its ``h * w``.
    """
    inv_freq = 1.0 / (_POSITION_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    d = inv_freq.shape[0]
    d_t = d // 3
    d_h = (d - d_t) // 2
    bands = (inv_freq[:d_t], inv_freq[d_t:d_t + d_h], inv_freq[d_t + d_h:])
    ts, ys, xs = [], [], []
    for b, (n, (h, w)) in enumerate(zip(window_rows, grid_hws)):
        hw = int(h) * int(w)
        if hw < 1 or n % hw:
            raise ValueError(f"window {b} has {n} rows, not a multiple of its grid h*w = {h}*{w}")
        j = torch.arange(n, device=device)
        rem = j % hw
        ts.append(j // hw)
        ys.append(rem // int(w))
        xs.append(rem % int(w))
    coords = (torch.cat(ts), torch.cat(ys), torch.cat(xs))
    return torch.cat([torch.outer(c.to(torch.float32), band) for c, band in zip(coords, bands)], dim=-1)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """VideoLLaMA3's ``apply_rotary_pos_emb_vision``: x (N, H, hd) rotated by angles (N, hd // 2) in fp32, cast
    back to x's dtype (``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = cat(-x2, x1)``)."""
    cos = angles.cos().repeat(1, 2).unsqueeze(1)            # (N, 1, hd)
    sin = angles.sin().repeat(1, 2).unsqueeze(1)
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    """The fork's ``Attention`` parameters: bias-free ``w_q``, ``w_k``, ``w_v``, ``w_o`` (C -> C)."""

    def __init__(self, embed_dim: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.head_dim = embed_dim // n_head
        self.w_q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_k = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_v = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_o = nn.Linear(embed_dim, embed_dim, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:       # (..., L, C) -> (..., H, L, hd)
        return x.unflatten(-1, (self.n_head, self.head_dim)).transpose(-3, -2)

    def self_attention(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, K, C): every window's queries attend to each other (non-causal, no rotary) -> (B, K, C)."""
        with sdpa_without_cudnn(x.device):
            y = F.scaled_dot_product_attention(self._heads(self.w_q(x)), self._heads(self.w_k(x)),
                                               self._heads(self.w_v(x)))
        return self.w_o(y.transpose(1, 2).flatten(-2))

    def cross_attention(self, x: torch.Tensor, kv: torch.Tensor, angles: torch.Tensor, windows: list[int],
                        chunks: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """x (B, K, C) queries at coordinate 0; kv (N, C) encoder rows, ``windows`` L_b summing to N; angles (N,
        hd/2) the keys' rotary. Each window's queries attend only to its own rows -> (B, K, C). ``chunks``: the
        windows' padded key layout from :func:`kv_chunks` (computed here when not given; the compressor computes
        it once for all its layers)."""
        k = apply_rotary(self.w_k(kv).unflatten(-1, (self.n_head, self.head_dim)), angles)   # (N, H, hd)
        v = self.w_v(kv).unflatten(-1, (self.n_head, self.head_dim))
        q = self._heads(self.w_q(x))                                                          # (B, H, K, hd)
        out = []
        with sdpa_without_cudnn(x.device):
            for b0, b1, index, valid in chunks if chunks is not None else kv_chunks(windows, kv.device):
                kb = k[index].permute(0, 2, 1, 3)                                             # (b, H, L, hd)
                vb = v[index].permute(0, 2, 1, 3)
                out.append(F.scaled_dot_product_attention(q[b0:b1], kb, vb, attn_mask=valid))
        y = torch.cat(out)                                                                    # (B, H, K, hd)
        return self.w_o(y.transpose(1, 2).flatten(-2))


def kv_chunks(windows: list[int], device: torch.device | str) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """The padded key layout of the cross-attention: consecutive windows in chunks of at most ``_KV_CHUNK_ROWS``
    padded key rows, each ``(b0, b1, index (b, L) long, valid (b, 1, 1, L) bool)`` for windows ``b0..b1-1``, ``L``
    their longest window, ``index`` the key rows of each window padded by repeating the last row of ``kv`` (masked
    out by ``valid``).

    Built on the host and sent with one non-blocking copy per tensor (from pinned memory on CUDA), so the
    compressor's forward never waits for the GPU: building them on the device from host lists would copy
    synchronously, 2 waits per chunk and layer (80 per predict step at 7B size, ``bench/qa_step_profile.py``).
    """
    device = torch.device(device)
    total = sum(windows)
    starts = [0]
    for n in windows:
        starts.append(starts[-1] + n)
    out = []
    b0 = 0
    while b0 < len(windows):
        longest, b1 = windows[b0], b0 + 1
        while b1 < len(windows) and (b1 + 1 - b0) * max(longest, windows[b1]) <= _KV_CHUNK_ROWS:
            longest = max(longest, windows[b1])
            b1 += 1
        pos = torch.arange(longest)
        valid = pos[None, :] < torch.tensor(windows[b0:b1])[:, None]                         # (b, L)
        index = (torch.tensor(starts[b0:b1])[:, None] + pos[None, :]).clamp_max(total - 1)
        index, valid = host_to_device(index, device), host_to_device(valid, device)
        out.append((b0, b1, index, valid[:, None, None, :]))
        b0 = b1
    return out


class MLP(nn.Module):
    """The fork's ``mlp``: ``fc1`` -> tanh-GELU -> ``fc2`` (biased)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class TransformerDecoderLayer(nn.Module):
    """The fork's ``TransformerDecoderLayer``: pre-LN self-attention, pre-LN cross-attention, pre-LN MLP."""

    def __init__(self, config: TokenCompressorConfig):
        super().__init__()
        c, eps = config.hidden_size, config.layer_norm_eps
        self.cross_attn = Attention(c, config.num_attention_heads)
        self.self_attn = Attention(c, config.num_attention_heads)
        self.layer_norm1 = nn.LayerNorm(c, eps=eps)
        self.layer_norm2 = nn.LayerNorm(c, eps=eps)
        self.layer_norm3 = nn.LayerNorm(c, eps=eps)
        self.mlp = MLP(c, config.intermediate_size)

    def forward(self, q, kv, angles, windows, chunks=None):
        q = q + self.self_attn.self_attention(self.layer_norm1(q))
        q = q + self.cross_attn.cross_attention(self.layer_norm2(q), kv, angles, windows, chunks)
        return q + self.mlp(self.layer_norm3(q))


class TransformerDecoderFlatCompressor(nn.Module):
    """K learned queries per window cross-attending to that window's encoder rows (see the module docstring)."""

    CONFIG_NAME = "config.json"
    WEIGHTS_NAME = "model.safetensors"

    def __init__(self, config: TokenCompressorConfig):
        super().__init__()
        config.check()
        self.config = config
        self.hidden_size = config.hidden_size
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.layers = nn.ModuleList(TransformerDecoderLayer(config) for _ in range(config.num_layers))
        self.query = nn.Parameter(torch.randn(1, config.num_queries, config.hidden_size) * 0.02)
        self.match_encoder_scale = bool(config.match_encoder_scale)
        if self.match_encoder_scale:
            self.out_gamma = nn.Parameter(torch.ones(config.hidden_size))
            self.out_beta = nn.Parameter(torch.zeros(config.hidden_size))
        self.adaptive_segmentation = bool(config.adaptive_segmentation)
        self._last_seg_lens = None

    def _position_encoding(self, device: torch.device) -> torch.Tensor:
        """:func:`sinusoidal_position_encoding` of the K queries in the query's dtype on ``device``, kept per device
        and dtype (made once: a host-to-device copy per call would wait for the GPU)."""
        key = (torch.device(device), self.query.dtype)
        cache = self.__dict__.setdefault("_tb_pe", {})
        if key not in cache:
            cache[key] = sinusoidal_position_encoding(self.num_queries, self.hidden_size).to(*key)
        return cache[key]

    @property
    def num_queries(self) -> int:
        return self.config.num_queries

    def output_len_for(self, n_frames: int) -> int:
        """Rows one window of ``n_frames`` frames becomes: K, or ``N * K`` with the adaptive segmenter on."""
        if not self.adaptive_segmentation:
            return self.num_queries
        from algorithms.segmentation import adaptive_segment_count
        return adaptive_segment_count(n_frames, self.config.segment_target_frames) * self.num_queries

    def _segment(self, kv: torch.Tensor, cu: list[int], grid_hws: list[tuple[int, int]]):
        """The fork's in-forward segmenter: each window cut by ``adaptive_segment_lengths`` of its per-frame means."""
        new_cu, new_grid, seg_all = [0], [], []
        for i, (h, w) in enumerate(grid_hws):
            hw = int(h) * int(w)
            span = cu[i + 1] - cu[i]
            if span % hw:
                raise ValueError(f"adaptive_segmentation: window {i} has {span} rows, not a multiple of h*w={hw}")
            per_frame = kv[cu[i]:cu[i + 1]].view(span // hw, hw, -1).float().mean(1)
            lens = adaptive_segment_lengths(per_frame, self.config.segment_target_frames,
                                            self.config.segment_force_every)
            seg_all.append(lens)
            for n in lens:
                new_cu.append(new_cu[-1] + n * hw)
                new_grid.append((h, w))
        self._last_seg_lens = seg_all
        return new_cu, new_grid

    def forward(self, kv: torch.Tensor, compression_cu_seqlens: torch.Tensor | list[int],
                grid_hws: list[tuple[int, int]], kept_idx=None) -> torch.Tensor:
        """Compress every window of one call.

        Args:
            kv: (N, C) or (1, N, C) encoder rows, windows concatenated (each frame-major, rows row-major).
            compression_cu_seqlens: (B+1,) window boundaries ``[0, L_0, L_0 + L_1, ..., N]``.
            grid_hws: ``(h_b, w_b)`` per window (``L_b`` a multiple of ``h_b * w_b``).
            kept_idx: the fork's pruned-KV indices (training only); must be None.

        Returns:
            (B * K, C) rows, window-major (with ``adaptive_segmentation`` on, each window first cut into its
            segments: ``sum_b N_b * K`` rows).

        Raises:
            ValueError: boundaries that do not tile ``kv``, a grid count other than B, a window that is not whole
                frames, or ``kept_idx`` given.
        """
        if kept_idx is not None:
            raise ValueError("kept_idx is the fork's training-time KV pruning; inference passes the full KV")
        if kv.dim() == 3:
            kv = kv.squeeze(0)
        cu = [int(x) for x in (compression_cu_seqlens.tolist() if torch.is_tensor(compression_cu_seqlens)
                               else compression_cu_seqlens)]
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != kv.shape[0] or any(b <= a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"compression_cu_seqlens {cu} do not tile {kv.shape[0]} rows into non-empty windows")
        if grid_hws is None or len(grid_hws) != len(cu) - 1:
            raise ValueError(f"grid_hws needs one (h, w) per window ({len(cu) - 1}), got "
                             f"{None if grid_hws is None else len(grid_hws)}")
        grid_hws = [(int(h), int(w)) for h, w in grid_hws]
        self._last_seg_lens = None
        if self.match_encoder_scale:
            ref = kv.detach().float()
            ref_mean, ref_std = ref.mean(0, keepdim=True), ref.std(0, keepdim=True).clamp_min(1e-6)
        if self.adaptive_segmentation:
            cu, grid_hws = self._segment(kv, cu, grid_hws)
        windows = [b - a for a, b in zip(cu, cu[1:])]
        angles = cross_rotary_angles(windows, grid_hws, self.head_dim, kv.device)
        q = (self.query + self._position_encoding(kv.device)).expand(len(windows), -1, -1)   # (B, K, C)
        chunks = kv_chunks(windows, kv.device)                                # one key layout for every layer
        for layer in self.layers:
            q = layer(q, kv, angles, windows, chunks)
        out = q.reshape(-1, self.hidden_size)                                 # (B * K, C)
        if self.match_encoder_scale:
            x = out.float()
            x = (x - x.mean(0, keepdim=True)) / x.std(0, keepdim=True).clamp_min(1e-6) * ref_std + ref_mean
            out = (x * self.out_gamma.float() + self.out_beta.float()).to(out.dtype)
        return out

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` (the fork's ``token_compressor_config`` fields) and ``model.safetensors``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / self.CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2))
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                  str(directory / self.WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: str | Path,
                        device: torch.device | str | None = None) -> "TransformerDecoderFlatCompressor":
        """Load from ``directory`` (safetensors only), strictly; built and read on ``device`` (``None``: the CPU;
        the weights go from the file to the device, ``safetensors.torch.load_file(device=...)``).

        Raises:
            FileNotFoundError: config or weights missing (path named).
            CheckpointError: missing/unexpected keys or shape mismatches, all listed.
            ValueError: a config the flat compressor cannot run (path and field named).
        """
        directory = Path(directory)
        cfg_path, w_path = directory / cls.CONFIG_NAME, directory / cls.WEIGHTS_NAME
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise FileNotFoundError(f"qbase compressor file not found: {p}")
        device = torch.device(device if device is not None else "cpu")
        with reading_checkpoint(cfg_path), device:
            model = cls(TokenCompressorConfig.from_dict(json.loads(cfg_path.read_text()), str(cfg_path)))
        with reading_checkpoint(w_path):
            load_state_dict_strict(model, load_file(str(w_path), device=str(device)), str(w_path))
        return model


def load_state_dict_strict(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(state)`` that raises one ``CheckpointError`` listing every missing, unexpected or
    mis-shaped key (with ``source``, the file, in the message)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or shapes:
        raise CheckpointError(f"{source}: weights do not match the module: missing={missing} unexpected={unexpected} "
                              f"shape_mismatch={shapes}")
    module.load_state_dict(state, strict=True)


__all__ = ["SUPPORTED_COMPRESSOR_TYPES", "TokenCompressorConfig", "TransformerDecoderFlatCompressor",
           "apply_rotary", "cross_rotary_angles", "load_state_dict_strict", "sinusoidal_position_encoding"]
