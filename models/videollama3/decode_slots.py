"""Decode slots: the fixed-address state of a ``static``/``graph`` decode step, kept across (video, budget)s so that
one captured CUDA graph is replayed for every answer batch of its shape bucket.

A CUDA graph holds raw addresses and host-side launch sizes. What a decode step reads and writes is therefore held
here, per shape bucket, instead of being made anew per (video, budget):

* the suffix ``StaticCache`` of Q rows x (n_b + R) positions, with n_b the batch's longest question suffix rounded
  up to :data:`SUFFIX_BUCKET` (the rows are left-padded to n_b; pads are masked, so the real rows' values are those
  of the unpadded batch in exact arithmetic);
* the step's token / position / mask buffers;
* a :class:`PrefixBuffer` (shared by the slots of one capacity that are never busy together): the prefix
  keys/values copied from the prefill's cache into C = L rounded up to
  :data:`PREFIX_BUCKET` rows, with the valid count L on the device (``used``), which the decode step's prefix
  attention reads (:func:`models.videollama3.shared_prefix.bounded_prefix_part`: FlashAttention's variable-length
  kernel with ``seqused_k`` on CUDA, a key mask elsewhere), so a new L needs no new graph.

A slot is *busy* from its acquisition (the answer batch's inputs) to the end of that batch's decoding, so two
(video, budget)s started together (``overlap_budgets``) never share one, nor one prefix buffer; a busy slot's
bucket gets a second slot.
At most :attr:`DecodeSlotPool.max_slots` slots are kept; the least recently used idle one is dropped (its graph and
buffers freed) to make room.

Legend: L prefix tokens, C prefix capacity, Q question rows, n_b bucketed suffix length, R decode steps, Hkv KV heads,
d head dim, G = H / Hkv.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

SUFFIX_BUCKET = 64      # question-suffix tokens: a slot's suffix region is the longest suffix rounded up to this
PREFIX_BUCKET = 2048    # prefix keys: a slot's prefix capacity is L rounded up to this
PREFIX_CHUNK = 512      # prefix keys per split of the decode step's prefix attention (split-KV: S = C / 512 chunks
                        # x Hkv heads of work, where one sequence of M <= 128 folded queries is Hkv blocks only)
MAX_SLOTS = 8           # slots kept per model (each holds a prefix buffer of C x Hkv x d per layer, keys and values)


def bucket(n: int, step: int) -> int:
    """``n`` rounded up to a multiple of ``step`` (at least ``step``)."""
    return max(step, -(-n // step) * step)


class PrefixBuffer:
    """The prefix keys/values of one (video, budget) at fixed addresses.

    Attributes:
        keys, values: per layer (C, Hkv, d) tensors (the variable-length kernel's layout), rows ``>= L`` stale.
        splits: S, the key chunks of :data:`PREFIX_CHUNK` rows the buffer is attended in (C / chunk; 1 when C is not
            a multiple of it).
        used: (S,) int32 on the device, the valid rows of each chunk (FlashAttention's ``seqused_k``), from L.
        cu_k: (S + 1,) int32 ``[0, chunk, 2 chunk, ..., C]`` on the device (the variable-length kernel's key offsets).
    """

    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.capacity = capacity
        self.key = self.key_of(layers, capacity, kv_heads, head_dim, dtype, device)
        # zero-filled: rows past ``used`` are read by no kernel on CUDA and masked (finite, so 0 x value) elsewhere
        self.keys = [torch.zeros(capacity, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(capacity, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.splits = capacity // PREFIX_CHUNK if capacity % PREFIX_CHUNK == 0 else 1
        self.chunk = capacity // self.splits
        # made on the device (no host copy): chunk starts, and the rows of each chunk (filled by load)
        self.starts = torch.arange(self.splits, dtype=torch.int32, device=device) * self.chunk
        self.used = torch.zeros(self.splits, dtype=torch.int32, device=device)
        self.cu_k = torch.arange(self.splits + 1, dtype=torch.int32, device=device) * self.chunk

    @staticmethod
    def key_of(layers: int, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device) -> tuple:
        """What makes two buffers interchangeable (:attr:`key`; :meth:`DecodeSlotPool.acquire` shares by it)."""
        return (layers, capacity, kv_heads, head_dim, dtype, torch.device(device))

    def set_length(self, length: int) -> None:
        """Set the valid rows to the first ``length`` of the buffer (each chunk's count, on the device)."""
        torch.clamp(length - self.starts, 0, self.chunk, out=self.used)

    def load(self, layers) -> None:
        """Copy the prefill cache's prefix (layer ``i``: ``keys``/``values`` (1, Hkv, L, d)) in; device work only.

        Raises:
            ValueError: L exceeds the capacity, or the layer count differs.
        """
        if len(layers) != len(self.keys):
            raise ValueError(f"prefix cache has {len(layers)} layers, the buffer {len(self.keys)}")
        length = layers[0].keys.shape[2]
        if length > self.capacity:
            raise ValueError(f"prefix of {length} keys does not fit a buffer of {self.capacity}")
        for layer, k, v in zip(layers, self.keys, self.values):
            k[:length].copy_(layer.keys[0].transpose(0, 1))
            v[:length].copy_(layer.values[0].transpose(0, 1))
        self.set_length(length)

    def cu_q(self, rows_folded: int) -> torch.Tensor:
        """(S + 1,) int32 ``[0, M, 2 M, ..., S M]`` on the device for M folded queries (each chunk gets them all)."""
        return torch.arange(self.splits + 1, dtype=torch.int32, device=self.used.device) * rows_folded

    def bounded(self, cu_q: torch.Tensor) -> dict[int, tuple]:
        """Per layer ``(keys, values, used, cu_k, cu_q)`` as :func:`models.videollama3.shared_prefix.shared_prefix`
        takes them (``cu_q``: :meth:`cu_q` of the slot's folded queries)."""
        return {i: (k, v, self.used, self.cu_k, cu_q) for i, (k, v) in enumerate(zip(self.keys, self.values))}


@dataclass(eq=False)
class DecodeSlot:
    """One shape bucket's decode-step state (see the module docstring).

    Attributes:
        key: ``(Q, n_b, n_b + R, C)``.
        sc: the suffix ``StaticCache`` (Q rows, n_b + R positions).
        tok, pos: (Q, 1) long buffers of the step's token and position.
        mask: additive (Q, 1, 1, n_b + R) mask of the suffix region.
        cu_q: (S + 1,) int32 ``[0, Q G, 2 Q G, ...]`` on the device (:meth:`PrefixBuffer.cu_q`).
        prefix: its :class:`PrefixBuffer`.
        replay: the captured step (``replay() -> logits``), or ``None`` (not captured yet, or ``static``).
        forward: the step itself (the closure the graph was captured from; kept alive with it).
    """

    key: tuple
    sc: object
    tok: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    cu_q: torch.Tensor
    prefix: PrefixBuffer
    replay: Callable[[], torch.Tensor] | None = None
    forward: Callable[[], torch.Tensor] | None = None
    busy: bool = False
    uses: int = 0
    last: int = field(default=0, repr=False)


class DecodeSlotPool:
    """The decode slots of one model: :meth:`acquire` one for an answer batch, :meth:`release` it after decoding.

    Counters (for benches and tests): ``made`` slots built, ``reused`` acquisitions served by an existing slot.
    """

    def __init__(self, max_slots: int = MAX_SLOTS):
        self.max_slots = max_slots
        self.slots: list[DecodeSlot] = []
        self.made = 0
        self.reused = 0
        self._clock = itertools.count(1)

    def acquire(self, key: tuple, prefix_key: tuple, build: Callable[[PrefixBuffer | None], DecodeSlot]) -> DecodeSlot:
        """An idle slot of ``key`` whose prefix buffer no busy slot uses (the most recently used), else a new one:
        ``build(prefix)`` with an idle prefix buffer of ``prefix_key`` (:attr:`PrefixBuffer.key`) to share, or
        ``None`` (build makes one), after dropping the least recently used idle slots while :attr:`max_slots` are
        kept; marked busy."""
        taken = {id(s.prefix) for s in self.slots if s.busy}
        idle = [s for s in self.slots if s.key == key and not s.busy and id(s.prefix) not in taken]
        if idle:
            slot = max(idle, key=lambda s: s.last)
            self.reused += 1
        else:
            spare = sorted((s for s in self.slots if not s.busy), key=lambda s: s.last)
            while len(self.slots) >= self.max_slots and spare:
                self.slots.remove(spare.pop(0))
            shared = next((s.prefix for s in sorted(self.slots, key=lambda s: -s.last)
                           if s.prefix.key == prefix_key and id(s.prefix) not in taken), None)
            slot = build(shared)
            self.slots.append(slot)
            self.made += 1
        slot.busy, slot.last = True, next(self._clock)
        slot.uses += 1
        return slot

    @staticmethod
    def release(slot: DecodeSlot) -> None:
        slot.busy = False

    def clear(self) -> None:
        """Drop every idle slot (busy ones stay until released and are dropped by a later :meth:`clear`)."""
        self.slots = [s for s in self.slots if s.busy]
