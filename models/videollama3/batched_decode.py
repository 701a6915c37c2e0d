"""The batched decoding machinery of :class:`~models.videollama3.answering.SharedPrefixAnswering`: greedy steps with a
lagged end check, shared-prefix attention over the batch-1 prefix cache, the suffix-only ``StaticCache`` and the
decode step captured as a CUDA graph once per shape bucket (:mod:`models.videollama3.decode_slots`) and replayed
for every (video, budget) of that bucket.

Legend: L prefix tokens, Q question rows answered together, n the longest question suffix, R decode steps, V vocab.

:class:`BatchedDecoding` is a base of :class:`~models.videollama3.answering.SharedPrefixAnswering` (its
``start_batched`` calls these), which reads ``model``, ``device``, ``dtype`` and ``_fused`` from
:class:`~models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable

import torch

from .decode_slots import PREFIX_BUCKET, DecodeSlot, DecodeSlotPool, PrefixBuffer, bucket

log = logging.getLogger(__name__)

def _flag_later(value: torch.Tensor, flag: torch.Tensor | None):
    """Start copying the 0-d bool ``value`` to the host without blocking; returns ``(read, flag)`` where ``read()``
    waits for that copy only (not for work queued after it) and returns the bool. ``flag``: a host buffer to reuse
    (pinned on CUDA) or ``None``."""
    if value.device.type != "cuda":
        v = bool(value)
        return (lambda: v), flag
    if flag is None:
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
    flag.copy_(value, non_blocking=True)
    event = torch.cuda.Event()
    event.record()

    def read() -> bool:
        event.synchronize()
        return bool(flag)

    return read, flag


def _replay_keeping(replay: Callable[[], torch.Tensor], keep: tuple) -> torch.Tensor:
    """``replay()``; ``keep`` is only held (by the ``functools.partial`` around this) so that the tensors a CUDA
    graph reads and writes live as long as it can be replayed."""
    return replay()



class BatchedDecoding:
    """Greedy decoding of Q question rows after their suffix prefill: ``dynamic`` steps (see
    :meth:`~models.videollama3.answering.SharedPrefixAnswering.start_batched`) or a fixed-shape step over a
    suffix-only ``StaticCache`` (:meth:`_static_decoder`), optionally replayed as a CUDA graph."""

    # decode-step kinds a CUDA graph was captured for in this process: (model, dtype, fused kernels on, ``q == 1``;
    # PyTorch specializes size-1 dimensions, so a one-row step may compile the fused kernels anew); a capture of a
    # kind seen before skips the warm-up (nothing is left to compile or initialise lazily)
    _graph_warm: set = set()

    @staticmethod
    def _greedy(logits: torch.Tensor, step_fn, q: int, max_new_tokens: int, ignore_eos: bool,
                eos: torch.Tensor) -> list[list[int]]:
        """Greedy decoding of Q rows from the suffix logits: (Q, steps) token ids, the steps up to the first one
        after which every row has produced an end token (or ``max_new_tokens``).

        The end check lags one step: step ``k + 1`` is launched before the host reads whether every row had ended
        at step ``k`` (a pinned flag copied without blocking, an event waited on), so the GPU always has a step
        queued while the host waits. When the answers end early, one extra step is computed and dropped; the tokens
        are those of checking every step before launching the next.
        """
        tokens = []
        done = torch.zeros(q, dtype=torch.bool, device=logits.device)
        flag = None
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1)                                      # (Q,)
            tokens.append(nxt)
            ended = None
            if not ignore_eos:
                done = done | torch.isin(nxt, eos)   # a new tensor: the flag read later is this step's
                ended, flag = _flag_later(done.all(), flag)
            if step == max_new_tokens - 1:
                break
            logits = step_fn(nxt, step + 1)                                     # launched before the check
            if ended is not None and ended():
                break
        return torch.stack(tokens, 1).tolist()

    @contextlib.contextmanager
    def _shared_prefix_attention(self, cache, slot: DecodeSlot | None = None):
        """Inside the block the LLM attends through :mod:`models.videollama3.shared_prefix` over ``cache`` (the
        prefill's); with ``slot``, the one-token decode steps read the prefix from the slot's prefix buffer."""
        from . import shared_prefix

        name = shared_prefix.register()
        text_cfg = self.model.config.get_text_config()
        old = text_cfg._attn_implementation
        self.model.set_attn_implementation({"text_config": name})
        bounded = slot.prefix.bounded(slot.cu_q) if slot is not None else None
        try:
            with shared_prefix.shared_prefix(cache.layers, bounded):
                yield
        finally:
            self.model.set_attn_implementation({"text_config": old})

    def decode_slots(self) -> DecodeSlotPool:
        """This model's :class:`~models.videollama3.decode_slots.DecodeSlotPool` (made at the first use)."""
        pool = self.__dict__.get("_decode_slot_pool")
        if pool is None:
            pool = self.__dict__["_decode_slot_pool"] = DecodeSlotPool()
        return pool

    def _decode_slot(self, rows: int, suffix_len: int, max_new_tokens: int, prefix_len: int) -> DecodeSlot:
        """A busy :class:`~models.videollama3.decode_slots.DecodeSlot` for ``rows`` question rows, a suffix region of
        ``suffix_len`` (already bucketed) + ``max_new_tokens`` positions and a prefix of ``prefix_len`` keys (its
        capacity bucket), from :meth:`decode_slots`; its suffix cache rewound to position 0. Release it with
        ``decode_slots().release`` after decoding."""
        cfg = self.model.config.get_text_config()
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        cap, total = bucket(prefix_len, PREFIX_BUCKET), suffix_len + max_new_tokens
        dev, dtype = self.device, self.dtype
        key = (rows, suffix_len, total, cap, dtype, dev, id(self.model))
        prefix_key = PrefixBuffer.key_of(cfg.num_hidden_layers, cap, kv_heads, head_dim, dtype, dev)

        def build(shared: PrefixBuffer | None) -> DecodeSlot:
            prefix = shared or PrefixBuffer(cfg.num_hidden_layers, cap, kv_heads, head_dim, dtype, dev)
            cu_q = prefix.cu_q(rows * (heads // kv_heads))
            return DecodeSlot(key=key, sc=self._suffix_cache(rows, total),
                              tok=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                              pos=torch.zeros(rows, 1, dtype=torch.long, device=dev),
                              mask=torch.zeros(rows, 1, 1, total, dtype=dtype, device=dev), cu_q=cu_q, prefix=prefix)

        slot = self.decode_slots().acquire(key, prefix_key, build)
        for layer in slot.sc.layers:
            layer.cumulative_length.zero_()
        return slot

    def _suffix_cache(self, rows: int, length: int):
        """A ``StaticCache`` of ``length`` positions for ``rows`` question rows, allocated now (not lazily at the
        first update, which would copy host data to the device and wait for the GPU mid-answer; the layers' write
        counters are made on the device for the same reason)."""
        from transformers import StaticCache

        cfg = self.model.config.get_text_config()
        sc = StaticCache(config=cfg, max_cache_len=length)
        for layer in sc.layers:   # made on the device: the library's host counter would be copied with a GPU wait
            layer.cumulative_length = torch.zeros((), dtype=layer.cumulative_length.dtype, device=self.device)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        sc.early_initialization(rows, cfg.num_key_value_heads, head_dim, self.dtype, self.device)
        return sc

    def _capture_step(self, forward: Callable[[], torch.Tensor], sc, warm: bool) -> Callable[[], torch.Tensor] | None:
        """Record ``forward`` (one decode step over the suffix ``StaticCache`` ``sc``) as a CUDA graph; returns
        ``replay() -> logits`` (the logits tensor the graph writes), or ``None`` where the step cannot be captured
        (a backend that synchronises inside it; logged, the caller decodes eagerly).

        ``warm``: first run ``forward`` twice on a side stream (lazy initialisation and the fused kernels' compilation
        must not happen inside a capture); its cache writes are overwritten later. Either way the layers' write
        positions are rewound to what they were before. The caller must keep alive everything ``forward`` reads
        for as long as it replays (the graph holds addresses, not references).
        """
        lengths = [layer.cumulative_length.clone() for layer in sc.layers]
        if warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):                                  # (writes are overwritten)
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(side)
        # capture on a side stream with the CUDAGraph API itself: ``torch.cuda.graph(...)`` would first synchronize
        # the device, run gc.collect() and empty the allocator cache, i.e. wait for the prefix prefill still running
        # and give its memory back, once per (video, budget). Error mode "thread_local": only this thread's unsafe
        # calls break the capture; with "global" (the default) the DataLoader's pin-memory thread pinning the next
        # video's frames meanwhile raised "operation not permitted when stream is capturing" there and invalidated
        # the capture (a CLI run ended so on the H100, 2026-12-06). The pinning touches no stream of this capture.
        cuda_graph = torch.cuda.CUDAGraph()
        capture = torch.cuda.Stream()
        capture.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(capture):
                cuda_graph.capture_begin(capture_error_mode="thread_local")
                try:
                    static_logits = forward()
                finally:
                    cuda_graph.capture_end()
        except RuntimeError as e:  # a backend that syncs inside the step cannot be captured: stay eager
            log.warning("CUDA graph capture of the decode step failed (%s); decoding eagerly", e)
            cuda_graph = None
        torch.cuda.current_stream().wait_stream(capture)
        for layer, n in zip(sc.layers, lengths):                           # rewind the cache write position
            layer.cumulative_length.copy_(n)
        if cuda_graph is None:
            return None

        def replay() -> torch.Tensor:
            cuda_graph.replay()
            return static_logits
        return replay

    def _static_decoder(self, slot: DecodeSlot, cache, inp: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor,
                        max_new_tokens: int, graph: bool):
        """Suffix prefill + a fixed-shape decode step over the slot's suffix-only ``StaticCache`` (optionally the
        slot's CUDA graph, captured at its first use and replayed for every later (video, budget) of its bucket),
        attending to the shared prefix through :mod:`models.videollama3.shared_prefix` (call inside
        :meth:`_shared_prefix_attention` with ``slot``).

        Layout of the static cache per row: ``[suffix (left-padded to n_b) | decode steps]``; the prefix stays in the
        prefill's batch-1 ``cache`` for the suffix prefill and is copied into the slot's prefix buffer for the decode
        steps (:mod:`models.videollama3.decode_slots`). The mask covers the suffix region only: an additive 4-D
        ``(Q, 1, 1, n_b + R)`` buffer whose column for the step's own key is opened in place before each step, so the
        step itself has fixed shapes and addresses (what a CUDA graph needs). The suffix prefill runs in causal query
        chunks of at most ``answer_chunk`` tokens
        (:meth:`~models.videollama3.answering.SharedPrefixAnswering._chunked_prefill`), each with its own additive
        ``(Q, 1, chunk, n_b + R)`` mask, so no ``(Q, 1, n, n + R)`` mask is built for a long question. The chunk
        masks stay dense (per-row pads and a lower-right causal edge, which SDPA cannot take as a flag or lengths;
        the suffix part's float32 scores are larger anyway): see
        :meth:`~models.videollama3.answering.SharedPrefixAnswering._chunked_prefill`.

        Returns:
            ``(suffix logits (Q, 1, V) of each row's last position, step_fn)`` with
            ``step_fn(next_tokens (Q,), step) -> logits (Q, 1, V)``.
        """
        q, longest = inp.shape
        prefix_len = valid.shape[1] - longest
        s0 = longest
        total = s0 + max_new_tokens
        dev, dtype = self.device, self.dtype
        neg = torch.finfo(dtype).min
        keys = torch.arange(total, device=dev)
        key_ok = torch.ones(q, total, dtype=torch.bool, device=dev)
        key_ok[:, :s0] = valid[:, prefix_len:]
        query_at = torch.arange(longest, device=dev)                           # cache index of suffix queries

        def chunk_mask(a: int, b: int) -> dict:
            """The additive (Q, 1, b - a, n + R) mask of suffix queries a..b-1 (the prefill's query chunk)."""
            allowed = key_ok[:, None, :] & (keys[None, None, :] <= query_at[None, a:b, None])   # (Q, b - a, total)
            mask = torch.zeros(q, 1, b - a, total, dtype=dtype, device=dev).masked_fill(~allowed[:, None], neg)
            return {"attention_mask": {"full_attention": mask}}
        sc, tok_buf, pos_buf, mask_buf = slot.sc, slot.tok, slot.pos, slot.mask
        slot.prefix.load(cache.layers)                                         # queued after the prefix prefill
        pos_buf.copy_(pos[:, -1:] + 1)
        mask_buf.zero_().masked_fill_(~(key_ok & (keys[None] < s0))[:, None, None], neg)

        if slot.forward is None:
            def forward() -> torch.Tensor:
                return self.model(input_ids=tok_buf, attention_mask={"full_attention": mask_buf},
                                  position_ids=pos_buf, past_key_values=sc, use_cache=True).logits
            slot.forward = forward

        run = slot.forward
        if graph and max_new_tokens > 1:
            if slot.replay is None:
                warm_key = (id(self.model), self.dtype, self._fused, q == 1)
                replay = self._capture_step(slot.forward, sc, warm=warm_key not in BatchedDecoding._graph_warm)
                if replay is None:              # not capturable: this slot decodes eagerly from now on
                    slot.replay = slot.forward
                else:
                    # later captures skip the warm-up: lazy initialisation (cuBLAS handles, workspaces, compiled
                    # kernels) is done
                    BatchedDecoding._graph_warm.add(warm_key)
                    # The graph holds raw addresses of what the step reads and writes: the suffix cache's keys,
                    # values and write positions, the step's token / position / mask buffers and the prefix buffer
                    # (the slot holds them all, and ``forward``'s closure the first four). Without such a reference
                    # the suffix cache's memory went back to the allocator while the graph still wrote into it: a
                    # write position reused by, e.g., the next step's argmax made ``index_copy_`` write out of
                    # bounds (the device-side assert of 2026-12-02, also under CUDA_LAUNCH_BLOCKING=1).
                    slot.replay = functools.partial(_replay_keeping, replay, (slot.forward, sc, slot.prefix))
            run = slot.replay
        # at a slot's first use the suffix prefill is launched after the capture: recording the graph is host work
        # that overlaps the prefix prefill on the GPU, while the ~1,000 launches of an eager suffix prefill fill the
        # driver's command queue and would block the host until the GPU drains it. The graph reads the cache write
        # position on the device, so it does not matter that it was recorded first.
        logits = self._chunked_prefill(chunk_mask, inp, pos, sc)

        def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
            tok_buf.copy_(nxt[:, None])
            if step > 1:
                pos_buf.add_(1)
            mask_buf[..., s0 + step - 1] = 0                                   # the step's own key
            return run()

        return logits, step_fn
