"""The "qbase" group compressor: K learned queries that turn one group of frames into K rows.

Legend: G groups, L_g encoder rows of group g (frames × hw), K queries (64), C vision hidden size.

Architecture (a small transformer decoder, Perceiver/Q-Former style): K learned query vectors; per layer,
self-attention among the queries, cross-attention from the queries to the group's encoder rows plus one
*video context* row (the mean of all the video's encoder rows), then an MLP; pre-LayerNorm residual blocks and a
final LayerNorm. The whole video goes through in one call with one attention window per group (a key-padding
mask), so the video context row is computed over the full video, never over a shard of it.

Weights live in ``<checkpoint>/qbase/{config.json, model.safetensors}`` and load strictly: a missing or
unexpected key is an error listing the keys.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from algorithms.errors import CheckpointError

from .loading import reading_checkpoint


@dataclass
class QBaseConfig:
    """Compressor shape: ``hidden_size`` = vision encoder width C; ``num_queries`` = K rows per group."""

    hidden_size: int
    num_queries: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0
    video_context: bool = True
    layer_norm_eps: float = 1e-6


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden_size {dim} is not divisible by num_heads {heads}")
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        # x (G, K, C), ctx (G, L, C), key_mask (G, L) True = attend
        g, k, c = x.shape
        h = self.heads
        q = self.q(x).view(g, k, h, c // h).transpose(1, 2)                       # (G, h, K, C/h)
        kv = self.kv(ctx).view(g, ctx.shape[1], 2, h, c // h).permute(2, 0, 3, 1, 4)  # (2, G, h, L, C/h)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)      # (G, h, K, C/h)
        return self.out(y.transpose(1, 2).reshape(g, k, c))


class _Layer(nn.Module):
    def __init__(self, cfg: QBaseConfig):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.norm_self = nn.LayerNorm(d, eps=eps)
        self.self_attn = _Attention(d, cfg.num_heads)
        self.norm_q = nn.LayerNorm(d, eps=eps)
        self.norm_kv = nn.LayerNorm(d, eps=eps)
        self.cross_attn = _Attention(d, cfg.num_heads)
        self.norm_mlp = nn.LayerNorm(d, eps=eps)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, q: torch.Tensor, ctx: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        s = self.norm_self(q)
        q = q + self.self_attn(s, s)
        q = q + self.cross_attn(self.norm_q(q), self.norm_kv(ctx), key_mask)
        return q + self.mlp(self.norm_mlp(q))


class QBaseCompressor(nn.Module):
    """K learned queries cross-attending to one group's encoder rows (one window per group, one call per video)."""

    CONFIG_NAME = "config.json"
    WEIGHTS_NAME = "model.safetensors"

    def __init__(self, config: QBaseConfig):
        super().__init__()
        self.config = config
        self.queries = nn.Parameter(torch.randn(config.num_queries, config.hidden_size) * 0.02)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    @property
    def num_queries(self) -> int:
        return self.config.num_queries

    def forward(self, rows: torch.Tensor, group_rows: list[int], video_context: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Compress every group of a video.

        Args:
            rows: (sum_g L_g, C) encoder rows of the video's compressed groups, concatenated in group order.
            group_rows: L_g for each of the G groups.
            video_context: (C,) the mean encoder row of the *whole* video (all its frames, raw ones included);
                default: the mean of ``rows``.

        Returns:
            (G, K, C) compressed rows.

        Raises:
            ValueError: ``sum(group_rows) != rows.shape[0]`` or an empty group.
        """
        if sum(group_rows) != rows.shape[0] or any(n <= 0 for n in group_rows):
            raise ValueError(f"group_rows {group_rows} do not partition {rows.shape[0]} rows")
        num_groups, longest = len(group_rows), max(group_rows)
        c = rows.shape[-1]
        ctx = rows.new_zeros(num_groups, longest + 1, c)                     # (G, L_max + 1, C)
        key_mask = torch.zeros(num_groups, longest + 1, dtype=torch.bool, device=rows.device)
        lengths = torch.tensor(group_rows, device=rows.device)
        pos = torch.arange(longest, device=rows.device)
        valid = pos[None, :] < lengths[:, None]                               # (G, L_max)
        ctx[:, :longest][valid] = rows
        key_mask[:, :longest] = valid
        if self.config.video_context:
            ctx[:, longest] = rows.mean(dim=0) if video_context is None else video_context.to(rows.dtype)
            key_mask[:, longest] = True
        q = self.queries.to(rows.dtype).unsqueeze(0).expand(num_groups, -1, -1)  # (G, K, C)
        for layer in self.layers:
            q = layer(q, ctx, key_mask)
        return self.norm(q)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / self.CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2))
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                  str(directory / self.WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "QBaseCompressor":
        """Load from ``directory`` (safetensors only).

        Raises:
            FileNotFoundError: config or weights missing (path named).
            ValueError: missing/unexpected keys or shape mismatches, all listed.
        """
        directory = Path(directory)
        cfg_path, w_path = directory / cls.CONFIG_NAME, directory / cls.WEIGHTS_NAME
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise FileNotFoundError(f"qbase compressor file not found: {p}")
        with reading_checkpoint(cfg_path):
            model = cls(QBaseConfig(**json.loads(cfg_path.read_text())))
        with reading_checkpoint(w_path):
            load_state_dict_strict(model, load_file(str(w_path)), str(w_path))
        return model


def load_state_dict_strict(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(state)`` that raises one ``ValueError`` listing every missing, unexpected or
    mis-shaped key (with ``source``, the file, in the message)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or shapes:
        raise CheckpointError(f"{source}: weights do not match the module: missing={missing} unexpected={unexpected} "
                         f"shape_mismatch={shapes}")
    module.load_state_dict(state)
