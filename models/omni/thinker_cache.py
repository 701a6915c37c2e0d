"""KV cache handling of the one-session thinker runner: the prompt cache, TMRoPE positions, cache cuts and row
eviction, and the from-scratch references of ``cache_replay`` (:class:`ThinkerKVCache`, mixed into
``OmniThinkerRunner``).

The positions and the two memory policies are described in ``models/omni/thinker.py``.
"""
from __future__ import annotations

import warnings

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .thinker_media import Payload


class ThinkerKVCache:
    """The prompt's KV cache, payload positions, LLM prefills on top of a cache, cache cuts / evictions and the
    from-scratch recomputations the ``cache_replay`` check compares with; the cache half of ``OmniThinkerRunner``.

    Uses the runner's ``thinker``, ``text_config``, ``prompt_token_ids``, ``layer``, ``geometry``, ``device`` and
    ``dtype``.
    """

    # ------------------------------------------------------------------------------------------- positions
    def prompt_positions(self) -> torch.Tensor:
        """(3, P) positions of the fixed prompt; a trailing ``<|vision_bos|><|audio_bos|>`` shares one position."""
        ids = self.prompt_token_ids
        pos = list(range(len(ids)))
        cfg = self.thinker.config
        if len(ids) >= 2 and ids[-2] == cfg.vision_start_token_id and ids[-1] == cfg.audio_start_token_id:
            pos[-1] = pos[-2]
        return torch.tensor(pos).view(1, -1).expand(3, -1).clone()

    def media_origin(self) -> int:
        """``O``: the first media position (last prompt position + 1)."""
        return int(self.prompt_positions().max()) + 1

    def payload_positions(self, payload: Payload, first_block: int) -> torch.Tensor:
        """(3, N) absolute TMRoPE positions of ``payload`` in a window whose first native block is ``first_block``."""
        ppb = int(round(self.geometry.positions_per_block))
        return self.media_origin() + payload.rel_pos + payload.block_shift * ppb * (payload.block - first_block)

    # ------------------------------------------------------------------------------------------------ LLM
    @torch.no_grad()
    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Prefill (N, D) ``embeds`` at (3, N) ``positions`` on top of ``cache``; returns (N, D) at ``self.layer``."""
        out = self.thinker.model.language_model(
            inputs_embeds=embeds.unsqueeze(0), position_ids=positions.to(self.device).unsqueeze(1),
            past_key_values=cache, use_cache=True, output_hidden_states=True)
        return out.hidden_states[self.layer][0]

    def _new_cache(self) -> tuple[DynamicCache, int]:
        cache = DynamicCache(config=self.text_config)
        ids = torch.tensor(self.prompt_token_ids, device=self.device)
        emb = self.thinker.get_input_embeddings()(ids)
        self._forward(emb, self.prompt_positions(), cache)
        return cache, len(self.prompt_token_ids)

    @staticmethod
    def _truncate(cache: DynamicCache, length: int) -> None:
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @staticmethod
    def _evict_rows(cache: DynamicCache, start: int, length: int) -> None:
        """Remove cache rows ``[start, start + length)`` of every layer's keys and values (all batch entries).

        Raises:
            TypeError: a layer is not a plain ``DynamicLayer`` (sliding-window / quantized layers keep extra state).
        """
        if length <= 0:
            return
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise TypeError(f"cannot evict rows from a {type(layer).__name__} cache layer")
            if not layer.is_initialized:
                continue
            n = layer.keys.shape[-2]
            if start + length > n:
                raise ValueError(f"evicting rows [{start}, {start + length}) from a cache of {n} rows")
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., start + length:, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., start + length:, :]], dim=-2)

    def _position_warning(self, positions: torch.Tensor, n_rows: int) -> bool:
        """Warn (once per stream: the caller stops asking after True) when sliding positions pass the text
        config's ``max_position_embeddings``. Returns whether it warned."""
        limit = getattr(self.text_config, "max_position_embeddings", None)
        top = int(positions.max())
        if limit is None or top < int(limit):
            return False
        seconds = n_rows * self.geometry.row_ms / 1000.0
        warnings.warn(f"memory_policy='sliding': a {seconds:g} s stream reaches TMRoPE position {top}, beyond the "
                      f"thinker text config's max_position_embeddings={limit} (positions 0..{int(limit) - 1}); "
                      f"sliding positions grow at {self.geometry.positions_per_s} per second and are never re-based "
                      f"(memory_policy='window' keeps them below {self.media_origin()} + "
                      f"{int(round(self.geometry.positions_per_block))} M)", stacklevel=3)
        return True

    @torch.no_grad()
    def recompute(self, payloads: list[Payload], first_block: int) -> torch.Tensor:
        """From scratch: prompt + ``payloads`` in one prefill, no cache reuse. Returns (D,) at the last token."""
        cache, _ = self._new_cache()
        emb = torch.cat([p.embeds for p in payloads])
        pos = torch.cat([self.payload_positions(p, first_block) for p in payloads], 1)
        return self._forward(emb, pos, cache)[-1].float().cpu()

    @torch.no_grad()
    def recompute_sliding(self, payloads: list[Payload], m_blocks: int) -> torch.Tensor:
        """Sliding-policy reference: ONE forward over prompt + ``payloads`` (every payload committed since the
        stream start, in commit order, then the row's payload) at absolute positions, no cache, under a 4-D additive
        float mask (1, 1, n, n): a token of a payload of block ``k`` attends to every prompt token, to the tokens of
        earlier payloads of blocks ``>= max(0, k - (m_blocks - 1))`` and causally within its own payload; prompt
        tokens attend causally among themselves. Returns (D,) at the last token.

        Raises:
            NotImplementedError: a flash-attention implementation (it takes no 4-D mask); use sdpa or eager.
        """
        lm = self.thinker.model.language_model
        if "flash" in str(lm.config._attn_implementation):
            raise NotImplementedError("the sliding cache_replay reference needs a 4-D attention mask: run with "
                                      "attn_implementation='sdpa' or 'eager' (or verify_rows=0)")
        n_prompt = len(self.prompt_token_ids)
        lens = [p.embeds.shape[0] for p in payloads]
        starts = [n_prompt + sum(lens[:i]) for i in range(len(payloads))]
        n = n_prompt + sum(lens)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:n_prompt, :n_prompt] = torch.ones(n_prompt, n_prompt, dtype=torch.bool).tril()
        for i, p in enumerate(payloads):
            rows = slice(starts[i], starts[i] + lens[i])
            allowed[rows, :n_prompt] = True
            first = max(0, p.block - (m_blocks - 1))
            for j in range(i):
                if payloads[j].block >= first:
                    allowed[rows, starts[j]: starts[j] + lens[j]] = True
            allowed[rows, rows] = torch.ones(lens[i], lens[i], dtype=torch.bool).tril()
        mask = torch.zeros(n, n, dtype=self.dtype).masked_fill(~allowed, torch.finfo(self.dtype).min)
        ids = torch.tensor(self.prompt_token_ids, device=self.device)
        emb = torch.cat([self.thinker.get_input_embeddings()(ids)] + [p.embeds for p in payloads])
        pos = torch.cat([self.prompt_positions()] + [self.payload_positions(p, 0) for p in payloads], 1)
        out = lm(inputs_embeds=emb.unsqueeze(0), attention_mask=mask.to(self.device)[None, None],
                 position_ids=pos.to(self.device).unsqueeze(1), use_cache=False, output_hidden_states=True)
        return out.hidden_states[self.layer][0, -1].float().cpu()

