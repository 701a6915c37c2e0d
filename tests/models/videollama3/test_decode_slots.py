"""models/videollama3/decode_slots.py and its use by the static / graph decode: one slot (one CUDA graph on CUDA)
per shape bucket, reused across (video, budget)s; the bounded prefix part equals the exact one."""
import gc

import pytest
import torch

from models.videollama3 import shared_prefix as sp
from models.videollama3.decode_slots import DecodeSlot, DecodeSlotPool, PrefixBuffer, bucket
from tests.conftest import MEDIA

QS = ["What animal is shown?\nA. A dog.\nB. A cockatoo.", "Colour?\nA. White.\nB. Green."]


def test_bucket_rounds_up_to_a_multiple_and_at_least_one_step():
    assert [bucket(n, 64) for n in (0, 1, 63, 64, 65, 128, 129)] == [64, 64, 64, 64, 128, 128, 192]
    assert bucket(16_700, 2048) == 18_432


def _slot(key, prefix):
    return DecodeSlot(key=key, sc=None, tok=None, pos=None, mask=None, cu_q=None, prefix=prefix)


def _prefix(cap):
    return PrefixBuffer(1, cap, 1, 2, torch.float32, torch.device("cpu"))


def test_pool_reuses_idle_slots_shares_idle_prefix_buffers_and_drops_the_least_recently_used():
    pool = DecodeSlotPool(max_slots=2)
    pa = _prefix(64)
    a = pool.acquire("a", pa.key, lambda shared: _slot("a", shared or pa))
    assert (pool.made, a.busy) == (1, True)
    # a busy slot is never handed out again: its bucket gets a second slot, with a prefix buffer of its own
    a2 = pool.acquire("a", pa.key, lambda shared: _slot("a", shared or _prefix(64)))
    assert a2 is not a and a2.prefix is not pa and pool.made == 2
    pool.release(a), pool.release(a2)
    assert pool.acquire("a", pa.key, lambda shared: pytest.fail("built")) is a2       # the most recent idle one
    pool.release(a2)
    # another bucket of the same capacity shares an idle prefix buffer; max_slots=2: the LRU idle slot (a) goes
    b = pool.acquire("b", pa.key, lambda shared: _slot("b", shared))
    assert b.prefix is a2.prefix and a not in pool.slots and pool.slots == [a2, b]
    # while b is busy its prefix buffer is taken: a2 (same buffer) cannot be used for "a"
    c = pool.acquire("a", pa.key, lambda shared: _slot("a", shared or _prefix(64)))
    assert c is not a2 and c.prefix is not b.prefix
    pool.release(b), pool.release(c)
    pool.clear()
    assert pool.slots == []


def test_prefix_buffer_load_copies_the_prefix_and_its_length():
    from types import SimpleNamespace

    buf = PrefixBuffer(2, 8, 2, 3, torch.float32, torch.device("cpu"))
    layers = [SimpleNamespace(keys=torch.randn(1, 2, 5, 3), values=torch.randn(1, 2, 5, 3)) for _ in range(2)]
    buf.load(layers)
    assert buf.used.tolist() == [5] and buf.cu_k.tolist() == [0, 8] and buf.cu_q(3).tolist() == [0, 3]
    for layer, k, v in zip(layers, buf.keys, buf.values):
        assert torch.equal(k[:5], layer.keys[0].transpose(0, 1)) and torch.equal(v[:5], layer.values[0].transpose(0, 1))
    with pytest.raises(ValueError, match="does not fit"):
        buf.load([SimpleNamespace(keys=torch.randn(1, 2, 9, 3), values=torch.randn(1, 2, 9, 3))] * 2)


@pytest.mark.parametrize("length", [11, 600, 1024])   # one chunk partly filled (one empty), 1.2 chunks, both full
def test_bounded_prefix_part_equals_the_exact_prefix_part_whatever_lies_past_the_valid_rows(length):
    torch.manual_seed(0)
    kv_heads, m, d, cap = 2, 6, 8, 1024                  # two chunks of 512 (split-KV by hand)
    buf = PrefixBuffer(1, cap, kv_heads, d, torch.float32, torch.device("cpu"))
    assert (buf.splits, buf.chunk, buf.cu_k.tolist()) == (2, 512, [0, 512, 1024])
    q = torch.randn(1, kv_heads, m, d)
    pk, pv = torch.randn(1, kv_heads, length, d), torch.randn(1, kv_heads, length, d)
    buf.keys[0].normal_().mul_(50), buf.values[0].normal_().mul_(50)     # stale rows past L: large, finite
    from types import SimpleNamespace
    buf.load([SimpleNamespace(keys=pk, values=pv)])
    assert buf.used.tolist() == [min(length, 512), max(0, length - 512)]
    args = (q, buf.keys[0], buf.values[0], buf.used, buf.cu_k, buf.cu_q(m), 0.3)
    out, lse = sp._prefix_part(q, pk, pv, 0.3)
    out_b, lse_b = sp.bounded_prefix_part(*args)          # on the CPU: the first L rows, the exact inputs
    assert torch.equal(out_b, out) and torch.equal(lse_b, lse)
    out_s, lse_s = sp.split_prefix_part(*args)            # a device's path: chunks masked and merged
    assert out_s.shape == out.shape == (1, kv_heads, m, d) and lse_s.shape == lse.shape == (1, kv_heads, m)
    torch.testing.assert_close(out_s, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_s, lse, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def two_prompts(tiny_vlm):
    from datamodules.decode import decode_video
    from models.videollama3 import prepare_budgets

    dec = decode_video(MEDIA / "cockatoo.mp4", 256)
    return [bi.prompt for bi in prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [128, 256], raw_mode="orig")]


def test_one_slot_serves_prefixes_of_different_lengths_with_the_sequential_tokens(tiny_vlm, two_prompts):
    a, b = two_prompts
    assert a.ids.numel() != b.ids.numel() and bucket(a.ids.numel(), 2048) == bucket(b.ids.numel(), 2048)
    pool = tiny_vlm.decode_slots()
    pool.clear()
    made, reused = pool.made, pool.reused
    for prompt in (a, b, a):
        seq = [x.token_ids for x in tiny_vlm.answer_all(prompt, QS, 7)]
        assert [x.token_ids for x in tiny_vlm.answer_batched(prompt, QS, 7, decode="static")] == seq
    assert (pool.made - made, pool.reused - reused) == (1, 2)
    assert not any(s.busy for s in pool.slots)


def test_batches_started_together_take_two_slots_and_a_dropped_one_gives_its_slot_back(tiny_vlm, two_prompts):
    a, b = two_prompts
    pool = tiny_vlm.decode_slots()
    pool.clear()
    made = pool.made
    want = [[x.token_ids for x in tiny_vlm.answer_all(p, QS, 5)] for p in (a, b)]
    fa = tiny_vlm.start_batched(a, QS, 5, decode="static")
    fb = tiny_vlm.start_batched(b, QS, 5, decode="static")     # same bucket, a's slot busy: a second slot
    assert pool.made - made == 2 and all(s.busy for s in pool.slots)
    assert [[x.token_ids for x in f()] for f in (fb, fa)] == want[::-1]
    assert not any(s.busy for s in pool.slots)
    dropped = tiny_vlm.start_batched(a, QS, 5, decode="static")   # never finished (another budget failed)
    assert sum(s.busy for s in pool.slots) == 1
    del dropped
    gc.collect()
    assert not any(s.busy for s in pool.slots)
