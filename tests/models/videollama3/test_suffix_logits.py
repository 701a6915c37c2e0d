"""Issue 35 §2: the question-suffix prefill computes logits for each question's last position only (the hidden
states are sliced before ``lm_head``), with the tokens and last-position logits of the full-logits path; a question
too long for the model's context is left unanswered with an error instead of being prefilled."""
from __future__ import annotations

import pytest
import torch

from models.videollama3.answering import ContextLengthError, SharedPrefixAnswering
from tests.conftest import MEDIA

# several suffix lengths in one batch (left padding inside the suffix region matters)
QUESTIONS = ["x", "Colour?\nA. White.\nB. Green.",
             "What animal is shown?\nA. A dog.\nB. A cockatoo.\nAnswer with the letter.",
             "A much longer question that makes the left padding inside the suffix region matter " * 6]


@pytest.fixture(scope="module")
def prompt(tiny_vlm):
    from datamodules.decode import decode_video
    from models.videollama3 import prepare_budgets

    dec = decode_video(MEDIA / "cockatoo.mp4", 1024)
    (bi,) = prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [128], raw_mode="orig")
    return bi.prompt


def _full_logits(self, **inputs):
    """Today's path before the fix: ``lm_head`` over every suffix position, then the last one read."""
    full = self.model(**inputs).logits
    _full_logits.shapes.append(tuple(full.shape))
    return full[:, -1:]


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_last_position_logits_equal_the_full_logits_path(tiny_vlm, prompt, decode, monkeypatch):
    real = SharedPrefixAnswering._last_logits
    got: list[torch.Tensor] = []
    head_rows: list[tuple] = []

    def spy(self, **inputs):
        out = real(self, **inputs)
        got.append(out)
        return out

    hook = tiny_vlm.model.lm_head.register_forward_hook(lambda m, i, o: head_rows.append(tuple(i[0].shape)))
    try:
        monkeypatch.setattr(SharedPrefixAnswering, "_last_logits", spy)
        new = tiny_vlm.answer_batched(prompt, QUESTIONS, max_new_tokens=6, decode=decode)
        _full_logits.shapes = []
        ref_logits: list[torch.Tensor] = []
        monkeypatch.setattr(SharedPrefixAnswering, "_last_logits",
                            lambda self, **kw: ref_logits.append(_full_logits(self, **kw)) or ref_logits[-1])
        old = tiny_vlm.answer_batched(prompt, QUESTIONS, max_new_tokens=6, decode=decode)
    finally:
        hook.remove()
    q, vocab = len(QUESTIONS), tiny_vlm.model.config.get_text_config().vocab_size
    longest = max(len(tiny_vlm.question_ids(prompt, t)[0]) for t in QUESTIONS)
    width = longest if decode == "dynamic" else -(-longest // 64) * 64     # static: the decode slot's suffix bucket
    assert longest > 60 and _full_logits.shapes == [(q, width, vocab)]     # what the old path made
    assert [tuple(t.shape) for t in got] == [(q, 1, vocab)]                 # what is made now
    assert head_rows[0] == (q, 1, tiny_vlm.model.config.get_text_config().hidden_size)
    assert torch.equal(got[0], ref_logits[0])
    assert [a.token_ids for a in new] == [a.token_ids for a in old]
    assert [a.token_ids for a in new] == [a.token_ids for a in tiny_vlm.answer_all(prompt, QUESTIONS, 6)]


def test_a_question_longer_than_the_context_is_an_error_not_a_prefill(tiny_vlm, prompt, monkeypatch):
    cfg = tiny_vlm.model.config.get_text_config()
    n_long = len(tiny_vlm.question_ids(prompt, QUESTIONS[3])[0])
    n_mid = len(tiny_vlm.question_ids(prompt, QUESTIONS[2])[0])
    L = prompt.ids.numel()
    ref = tiny_vlm.answer_batched(prompt, QUESTIONS, max_new_tokens=4)
    # the long question's prompt + 4 answer tokens is one position too long; the others fit
    monkeypatch.setattr(cfg, "max_position_embeddings", L + n_long + 4 - 1)
    assert n_mid + 4 <= n_long + 3
    prefilled = []
    real = SharedPrefixAnswering._last_logits
    monkeypatch.setattr(SharedPrefixAnswering, "_last_logits",
                        lambda self, **kw: prefilled.append(kw["input_ids"].shape) or real(self, **kw))
    for decode in ("dynamic", "static"):
        prefilled.clear()
        got = tiny_vlm.answer_batched(prompt, QUESTIONS, max_new_tokens=4, decode=decode)
        width = n_mid if decode == "dynamic" else -(-n_mid // 64) * 64   # static: the slot's suffix bucket
        assert prefilled == [(3, width)]                   # the long one is not in the batch
        assert [a.token_ids for a in got[:3]] == [a.token_ids for a in ref[:3]]
        assert got[3].token_ids == [] and got[3].seq_len == L + n_long
        assert got[3].error == (f"prompt of {L + n_long} tokens + 4 answer tokens is longer than the model's "
                                f"context ({L + n_long + 3} positions, max_position_embeddings)")
    seq = tiny_vlm.answer_all(prompt, QUESTIONS, 4)
    assert [a.error is None for a in seq] == [True, True, True, False]
    assert [a.token_ids for a in seq[:3]] == [a.token_ids for a in ref[:3]]
    assert tiny_vlm.answer_from_scratch(prompt, QUESTIONS[3], 4).error == got[3].error
    # a prefix that alone does not fit: the video fails (its error records), before any work
    monkeypatch.setattr(cfg, "max_position_embeddings", L)
    with pytest.raises(ContextLengthError, match=rf"video prefix: prompt of {L} tokens \+ 4 answer tokens"):
        tiny_vlm.answer_batched(prompt, QUESTIONS[:1], max_new_tokens=4)


def test_an_unanswered_question_becomes_its_error_record():
    from datamodules.benchmarks import Question
    from lightning_modules.budgeted_qa import qa_record
    from models.videollama3 import Answer

    item = {"video_id": "v", "video_path": "/data/v.mp4", "benchmark": "videomme"}
    q = Question(qid="v-2", video_id="v", video_path="/data/v.mp4", question="?", options=["x", "y"], answer="B",
                 meta={"task": "t"})
    a = Answer([], "", 40000, error="prompt of 40000 tokens + 16 answer tokens is longer than the model's context")
    rec = qa_record(item, q, a, {}, 4, "b128", 128, None, "t")
    assert rec == {"qid": "v-2", "video": "v", "benchmark": "videomme", "job": "b128", "budget": 128,
                   "variant": None, "answer": "B", "meta": {"task": "t"},
                   "error": "/data/v.mp4: question v-2: prompt of 40000 tokens + 16 answer tokens is longer than "
                            "the model's context"}
