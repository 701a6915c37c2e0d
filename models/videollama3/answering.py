"""Answering a (video, budget)'s questions with budgeted VideoLLaMA3: one prefilled prefix, greedy decoding, graph replay.

Legend: L prefix tokens, Q question rows answered together, n the longest question suffix, R decode steps, V vocab.

Three paths give the same greedy tokens (DESIGN §3.7): :meth:`SharedPrefixAnswering.answer_from_scratch` (the
reference: the whole prompt in one pass; with ``one_pass=False`` the fallback's bounded form),
:meth:`~SharedPrefixAnswering.answer_all` (one prefilled prefix, one question at a time) and :meth:`~SharedPrefixAnswering.answer_batched` (all questions together; ``static``/``graph``
decoding attends to the batch-1 prefix cache through :mod:`models.videollama3.shared_prefix`, with the decode step
optionally captured once as a CUDA graph, :mod:`models.videollama3.batched_decode`).

:class:`SharedPrefixAnswering` is one of the parts composed by :class:`models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from algorithms.answer_batches import length_batches, query_chunks
from algorithms.errors import SettingError
from ..kernels import host_to_device
from ..vision_attention import sdpa_without_cudnn
from .batched_decode import BatchedDecoding
from .decode_slots import SUFFIX_BUCKET, DecodeSlotPool, bucket
from .layout import VideoPrompt

log = logging.getLogger(__name__)


class ContextLengthError(ValueError):
    """A prompt (plus the answer's ``max_new_tokens``) longer than the language model's context."""


@dataclass
class Answer:
    """One greedy answer: generated token ids (without the prompt), decoded text (``.strip()``-ed, as seed 001's
    ``decode(new, skip_special_tokens=True).strip()``), prompt length, fallback flag.

    ``error``: set (and no tokens) when the question was not answered: its prompt of ``seq_len`` tokens plus
    ``max_new_tokens`` does not fit the model's context (:meth:`SharedPrefixAnswering.context_error`)."""

    token_ids: list[int]
    text: str
    seq_len: int
    fallback: bool = False
    error: str | None = None


class SharedPrefixAnswering(BatchedDecoding):
    """Answer questions greedily from one prefilled video prefix: one by one, or batched with shared-prefix attention
    and a fixed-shape (optionally CUDA-graph) decode step.

    A part of :class:`~models.videollama3.model.BudgetedVideoLlama3`, which sets the attributes read here:
    ``model``, ``tokenizer``, ``eos_ids``, ``_fused``, ``device``/``dtype``, and provides ``question_ids`` and
    ``embed`` (:class:`~models.videollama3.layout.PromptLayout`). The decoding steps, the static cache and the CUDA
    graph capture are :class:`~models.videollama3.batched_decode.BatchedDecoding`'s.

    Memory of batched answering (issue 44 item 1), two settings (:meth:`set_answer_batching`):

    * ``answer_rows`` (default 64): most questions prefilled and decoded together; more
      questions of one prefix are answered in several batches one after the other, so the decode batch, its
      (Q, 1, V) logits and the per-row caches stay bounded however many questions a video has (10,000 questions on
      one video made 10,000 x V fp32 logits and 10,000 copies of the prefix cache);
    * ``answer_chunk`` (default 2048): question-suffix tokens (rows x columns) per
      suffix-prefill forward. Questions are batched by length (:func:`algorithms.answer_batches.length_batches`:
      a batch's pads stay within its real tokens unless the whole padded batch fits ``answer_chunk``), and a batch
      larger than ``answer_chunk`` is prefilled in causal query chunks against the cached prefix and the earlier
      chunks (:func:`~algorithms.answer_batches.query_chunks`), so the attention mask of a forward is
      ``(Q, 1, chunk, L + n)``, not ``(Q, 1, n, L + n)`` (a 25,084-token question beside two short ones made a
      [3, 1, n, L + n] mask).

    A video's 1-10 ordinary questions (each ~100 tokens) fit one batch and one chunk: the same inputs, kernels and
    tokens as without these limits. Split batches and chunks give the same tokens in exact arithmetic; in floating
    point the chunks' matrix products may round differently (tested equal to the one-question path on the tiny
    fp32 model).
    """

    answer_rows: int = 64
    answer_chunk: int = 2048

    def set_answer_batching(self, rows: int = 64, chunk: int = 2048):
        """Set ``answer_rows`` and ``answer_chunk`` (see the class docstring); returns ``self``.

        Raises:
            SettingError: a value that is not an integer >= 1 (named).
        """
        for name, value in (("answer_rows", rows), ("answer_chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingError(f"{name} must be an integer >= 1, got {value!r}")
        self.answer_rows, self.answer_chunk = rows, chunk
        return self

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int, cache=None, inputs_embeds=None,
                  ignore_eos: bool = False) -> list[int]:
        out = self.model.generate(
            input_ids=input_ids.view(1, -1).to(self.device), inputs_embeds=inputs_embeds, past_key_values=cache,
            max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if ignore_eos else None, do_sample=False,
            num_beams=1, temperature=None, top_p=None, top_k=None, eos_token_id=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id, use_cache=True)
        new = out[0, input_ids.numel():].tolist()  # generate returns prompt + new tokens when input_ids is given
        if new and new[-1] in self.eos_ids and not ignore_eos:
            new = new[:-1]
        return new

    def context_limit(self) -> int:
        """Positions the language model was built for: the text config's ``max_position_embeddings``."""
        return int(self.model.config.get_text_config().max_position_embeddings)

    def context_error(self, seq_len: int, max_new_tokens: int) -> str | None:
        """Why a prompt of ``seq_len`` tokens answered with up to ``max_new_tokens`` tokens does not fit the model's
        context (:meth:`context_limit`), or ``None`` when it fits. Checked before any prefill, so a too-long
        question costs nothing (a 25k-token question asked for 45.7 GB of activations, issue 35)."""
        limit = self.context_limit()
        if seq_len + max_new_tokens > limit:
            return (f"prompt of {seq_len} tokens + {max_new_tokens} answer tokens is longer than the model's context "
                    f"({limit} positions, max_position_embeddings)")
        return None

    def _check_prefix(self, prompt: VideoPrompt, max_new_tokens: int) -> None:
        """Raise :class:`ContextLengthError` when the prefix alone (+ ``max_new_tokens``) does not fit the context."""
        error = self.context_error(prompt.ids.numel(), max_new_tokens)
        if error:
            raise ContextLengthError(f"video prefix: {error}")

    def _skipped(self, seq_len: int, fallback: bool, error: str) -> Answer:
        log.warning("question not answered: %s", error)
        return Answer(token_ids=[], text="", seq_len=seq_len, fallback=fallback, error=error)

    def _last_logits(self, **inputs) -> torch.Tensor:
        """Logits of the last position only, (Q, 1, V): the decoder's hidden states sliced before ``lm_head``.

        ``VideoLlama3ForConditionalGeneration.forward`` applies ``lm_head`` to every position and drops
        ``logits_to_keep`` (transformers 5.23 ``modeling_video_llama_3.py``: ``logits = self.lm_head(hidden_states)``),
        so a suffix prefill through it made Q x n x V logits. The rows are left-padded to end in the same column, so
        the last column is each question's last token, the only logits greedy decoding reads."""
        hidden = self.model.model(**inputs).last_hidden_state                   # (Q, n, hidden)
        return self.model.lm_head(hidden[:, -1:])

    def _answer(self, tokens: list[int], seq_len: int, fallback: bool) -> Answer:
        # seed 001 answer(): ``self.tok.decode(new, skip_special_tokens=True).strip()``
        return Answer(token_ids=tokens, text=self.tokenizer.decode(tokens, skip_special_tokens=True).strip(),
                      seq_len=seq_len, fallback=fallback)

    @torch.no_grad()
    def answer_from_scratch(self, prompt: VideoPrompt, question_text: str, max_new_tokens: int = 16,
                            ignore_eos: bool = False, one_pass: bool = True) -> Answer:
        """Answer one question without the shared prefix cache and decode greedily (``ignore_eos``: exactly
        ``max_new_tokens`` tokens).

        ``one_pass=True`` (the reference of the tests): the whole prompt (prefix + question) in one ``generate``
        pass; its memory grows with the prompt (``generate`` through ``VideoLlama3ForConditionalGeneration`` makes
        (L + n) x V logits, and a long question asks for an attention over (L + n) x (L + n)).
        ``one_pass=False`` (the fallback of :meth:`answer_all` / :meth:`start_batched`, DESIGN §3.7): the prompt's
        prefix (without its last text piece) prefilled through the base model (no ``lm_head``, as :meth:`prefill`),
        the question by :meth:`_prefill_question` (causal chunks of at most ``answer_chunk`` tokens), so the peak
        grows with the chunk, not with the question (issue 44 item 1); the same tokens in exact arithmetic.
        """
        q_ids, fallback = self.question_ids(prompt, question_text)
        base = prompt.ids if not fallback else prompt.ids[: len(prompt.ids) - prompt.last_text_len]
        full = torch.cat([base, torch.tensor(q_ids, dtype=torch.long)])
        error = self.context_error(full.numel(), max_new_tokens)
        if error:
            return self._skipped(full.numel(), fallback, error)
        if one_pass:
            emb = self.embed(full, prompt.vision_embeds)
            return self._answer(self._generate(full, max_new_tokens, inputs_embeds=emb, ignore_eos=ignore_eos),
                                full.numel(), fallback)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config.get_text_config())
        with sdpa_without_cudnn(self.device):
            self.model.model(inputs_embeds=self.embed(base, prompt.vision_embeds), past_key_values=cache,
                             use_cache=True)
        self._prefill_question(cache, full, base.numel())
        return self._answer(self._generate(full, max_new_tokens, cache=cache, ignore_eos=ignore_eos), full.numel(),
                            fallback)

    def _prefill_question(self, cache, full: torch.Tensor, start: int) -> None:
        """Feed the question tokens ``full[start:-1]`` (all but the last) into ``cache`` (batch 1, holding
        ``full[:start]``) in causal chunks of at most ``answer_chunk`` tokens
        (:func:`algorithms.answer_batches.query_chunks`), through the base model: no ``lm_head``, so no logits.
        ``generate`` then feeds only the last token (it skips the cached positions), whose logits (1, 1, V) are the
        only ones greedy decoding reads; before, ``generate`` fed the n question tokens in one forward and
        ``VideoLlama3ForConditionalGeneration`` made n x V logits (issue 44 item 1: the sequential and fallback
        paths). Positions follow the cache (``L + j``), as in one pass. One row, no pads: no 2-D mask is passed
        (transformers still builds its (1, 1, chunk, L + b) boolean causal mask per chunk, see
        :meth:`_chunked_prefill`)."""
        body = full[start:-1]
        if not body.numel():
            return
        body = host_to_device(body.view(1, -1), self.device)
        for a, b in query_chunks(1, body.shape[1], self.answer_chunk):
            self.model.model(input_ids=body[:, a:b], past_key_values=cache, use_cache=True)

    @torch.no_grad()
    def answer_all(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                   ignore_eos: bool = False) -> list[Answer]:
        """Answer every question of a (video, budget) from one prefilled prefix (DESIGN §3.7).

        The prefix is prefilled once into a ``DynamicCache``; each question's tokens but the last are then fed
        in causal chunks of at most ``answer_chunk`` tokens (:meth:`_prefill_question`: no logits), ``generate`` on
        the full ids feeds the last one and decodes, and the cache is cropped back to the prefix (memory grows with
        ``answer_chunk``, not with the question: issue 44 item 1).
        A question whose text merges with the prefix's last piece falls back to
        :meth:`answer_from_scratch` (``one_pass=False``: chunked the same way).
        A question too long for the model's context gets an :class:`Answer` with ``error`` set.

        Raises:
            ContextLengthError: the prefix alone does not fit the context (see :meth:`prefill`).
        """
        cache = self.prefill(prompt, max_new_tokens)
        prefix_len = prompt.ids.numel()
        answers = []
        for text in question_texts:
            q_ids, fallback = self.question_ids(prompt, text)
            if fallback:
                answers.append(self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos, one_pass=False))
                continue
            error = self.context_error(prefix_len + len(q_ids), max_new_tokens)
            if error:
                answers.append(self._skipped(prefix_len + len(q_ids), False, error))
                continue
            full = torch.cat([prompt.ids, torch.tensor(q_ids, dtype=torch.long)])
            self._prefill_question(cache, full, prefix_len)       # chunks of at most answer_chunk, no logits
            tokens = self._generate(full, max_new_tokens, cache=cache, ignore_eos=ignore_eos)
            cache.crop(prefix_len - cache.get_seq_length())  # negative: tokens to drop (transformers 5 API)
            answers.append(self._answer(tokens, full.numel(), False))
        return answers


    @torch.no_grad()
    def prefill(self, prompt: VideoPrompt, max_new_tokens: int = 1):
        """Prefill the shared prefix once; returns the ``DynamicCache`` holding its keys/values (batch 1).

        Raises:
            ContextLengthError: the prefix's L tokens + ``max_new_tokens`` do not fit the model's context (checked
                before any work; the video's questions all become error records).
        """
        from transformers import DynamicCache

        self._check_prefix(prompt, max_new_tokens)

        cache = DynamicCache(config=self.model.config.get_text_config())
        # the base model only: no lm_head (VideoLlama3ForConditionalGeneration ignores logits_to_keep and would
        # compute logits for every prefix position, ~5 GB at 16k rows on 7B shapes)
        with sdpa_without_cudnn(self.device):   # no per-shape cuDNN plans (a new prefix length every video)
            self.model.model(inputs_embeds=self.embed(prompt.ids, prompt.vision_embeds), past_key_values=cache,
                             use_cache=True)
        return cache

    @torch.no_grad()
    def answer_batched(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                       ignore_eos: bool = False, decode: str = "dynamic") -> list[Answer]:
        """Answer all questions of a (video, budget) together from one prefilled prefix, greedy.

        The questions are answered in batches of at most ``answer_rows``, batched by length (one batch for a video's
        ordinary questions; see the class docstring). Per batch, the prefix cache (batch 1) is repeated to its Q rows
        (``dynamic``) or attended once for all rows (``static``/``graph``); the question suffixes are left-padded
        *inside the suffix region* so they end in the same column, and prefilled in query chunks of at most
        ``answer_chunk`` tokens, with a 2-D attention mask hiding the pads and explicit
        position ids ``L + j`` for the j-th real suffix token (so every row sees exactly the positions of the
        one-by-one path); then Q tokens are decoded per step until every row has produced an end token or
        ``max_new_tokens``. Token-identical to :meth:`answer_all` up to floating-point reduction order (tested
        exact on the tiny fp32 model). Questions that need the fallback of DESIGN §3.7 are answered alone.
        ``start_batched(...)()``: see :meth:`start_batched` to overlap several prefixes.

        Args:
            ignore_eos: decode exactly ``max_new_tokens`` tokens (benchmarks with forced answer length).
            decode: ``dynamic`` (``DynamicCache``, masks built by transformers each step), ``static``
                (a ``StaticCache`` of fixed length and a prepared 4-D mask updated in place: fixed shapes every
                step) or ``graph`` (``static`` with the decode step captured once as a CUDA graph and replayed;
                CUDA only).

        Raises:
            SettingError: an unknown ``decode``.
            ValueError: ``decode="graph"`` off CUDA.
        """
        return self.start_batched(prompt, question_texts, max_new_tokens, ignore_eos, decode)()

    @torch.no_grad()
    def start_batched(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                      ignore_eos: bool = False, decode: str = "dynamic") -> Callable[[], list[Answer]]:
        """:meth:`answer_batched` in two halves: launch the prefix prefill, the question-suffix prefill and (for
        ``graph``) the decode-step capture now, without waiting for the GPU; the returned ``finish()`` decodes and
        returns the answers (in the order of ``question_texts``; call it once).

        Starting every budget's prefix of a video before finishing any keeps work queued on the GPU while the host
        records the next budget's graph and builds its inputs (``BudgetedQA(overlap_budgets=True)``: 1.524 -> 1.446 s
        per video for 4k + 16k on the H200, ``bench/cli_throughput.py``, same machine); the price is that every
        started prefix's cache is held until its ``finish``. The tokens are those of :meth:`answer_batched` (same kernels, same shapes).
        Only the first answer batch is started here; later ones (more than ``answer_rows`` questions, or questions
        of very different lengths) are prefilled and decoded in ``finish``, one after the other, so that one batch's
        suffix state is held at a time.
        Fallback questions (DESIGN §3.7) are answered from scratch here, before returning. A question whose prompt
        does not fit the model's context (:meth:`context_error`) is left out of the batch (no prefill, no logits) and
        gets an :class:`Answer` with ``error`` set; the suffix prefill computes logits for each row's last position
        only (:meth:`_last_logits`).

        Raises:
            ContextLengthError: the prefix alone does not fit the context.
        """
        if decode not in ("dynamic", "static", "graph"):
            raise SettingError(f"decode must be 'dynamic', 'static' or 'graph', got {decode!r}")
        if decode == "graph" and self.device.type != "cuda" and max_new_tokens > 1:
            raise ValueError("decode='graph' needs a CUDA device")
        self._check_prefix(prompt, max_new_tokens)
        answers: list[Answer | None] = [None] * len(question_texts)
        batch, rows = [], []
        for i, text in enumerate(question_texts):
            ids, fallback = self.question_ids(prompt, text)
            if fallback:
                answers[i] = self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos, one_pass=False)
                continue
            error = self.context_error(prompt.ids.numel() + len(ids), max_new_tokens)
            if error:
                answers[i] = self._skipped(prompt.ids.numel() + len(ids), False, error)
            else:
                batch.append(ids)
                rows.append(i)
        if not batch:
            return lambda: answers
        prefix_len = prompt.ids.numel()
        groups = length_batches([len(x) for x in batch], self.answer_rows, self.answer_chunk)
        eos = host_to_device(torch.tensor(self.eos_ids), self.device)
        # the first batch as before: its inputs (and static cache) are on the device before the prefix prefill is
        # launched, so that from here to the final read of the tokens nothing waits for the GPU and the host-side work
        # of the answer stage overlaps the prefill
        first = self._suffix_inputs([batch[r] for r in groups[0]], prefix_len, max_new_tokens, decode)
        try:
            cache = self.prefill(prompt, max_new_tokens)                        # batch 1
        except BaseException:
            if first[3] is not None:                                            # the decode slot taken for it
                self.decode_slots().release(first[3])
            raise
        started = [self._start_group(cache, *first, max_new_tokens, ignore_eos, decode, eos,
                                     keep_prefix=len(groups) > 1)]

        def finish() -> list[Answer]:
            for g, group in enumerate(groups):
                if g:   # later batches: prefilled and decoded one after the other (one batch's memory at a time)
                    inputs = self._suffix_inputs([batch[r] for r in group], prefix_len, max_new_tokens, decode)
                    started.append(self._start_group(cache, *inputs, max_new_tokens, ignore_eos, decode, eos,
                                                     keep_prefix=g < len(groups) - 1))
                gen = started.pop()()                                           # (the batch's state goes with it)
                for r, toks in zip(group, gen):
                    if not ignore_eos:
                        for j, t in enumerate(toks):
                            if t in self.eos_ids:
                                toks = toks[:j]
                                break
                    answers[rows[r]] = self._answer(toks, prefix_len + len(batch[r]), False)
            return answers

        return finish

    def _suffix_inputs(self, batch: list[list[int]], prefix_len: int, max_new_tokens: int, decode: str) -> tuple:
        """One answer batch's suffix inputs on the device: ``(inp (Q, n) left-padded question ids, valid (Q, L + n)
        keys a row may attend (pads excluded), pos (Q, n) position ids L + j of the j-th real suffix token, the
        busy :class:`~models.videollama3.decode_slots.DecodeSlot` (suffix ``StaticCache`` of n + R positions) or
        None for ``dynamic``)``; for ``static``/``graph`` n is the longest suffix rounded up to
        :data:`~models.videollama3.decode_slots.SUFFIX_BUCKET` (the extra left pads are masked)."""
        q = len(batch)
        longest = max(len(x) for x in batch)
        if decode != "dynamic":     # the decode slot's suffix bucket: more left pads, masked (decode_slots)
            longest = bucket(longest, SUFFIX_BUCKET)
        pad = self.tokenizer.pad_token_id or 0
        inp = torch.full((q, longest), pad, dtype=torch.long)
        valid = torch.zeros(q, prefix_len + longest, dtype=torch.bool)
        valid[:, :prefix_len] = True
        pos = torch.full((q, longest), prefix_len, dtype=torch.long)
        for r, ids in enumerate(batch):
            n = len(ids)
            inp[r, longest - n:] = torch.tensor(ids)
            valid[r, prefix_len + longest - n:] = True
            pos[r, longest - n:] = prefix_len + torch.arange(n)
        inp, valid, pos = (host_to_device(t, self.device) for t in (inp, valid, pos))
        slot = self._decode_slot(q, longest, max_new_tokens, prefix_len) if decode != "dynamic" else None
        return inp, valid, pos, slot

    def _start_group(self, cache, inp: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, static,
                     max_new_tokens: int, ignore_eos: bool, decode: str, eos: torch.Tensor,
                     keep_prefix: bool) -> Callable[[], list[list[int]]]:
        """Prefill one answer batch's suffixes over the prefix ``cache`` (batch 1) and return ``decode_all()`` ->
        its (Q, steps) greedy tokens. ``keep_prefix``: later batches need ``cache`` as it is (``dynamic`` then
        repeats the prefix into a new cache instead of repeating ``cache`` itself in place)."""
        q = inp.shape[0]
        if decode == "dynamic":
            if keep_prefix:
                cache = self._repeated_prefix(cache, q)
            elif q > 1:
                cache.batch_repeat_interleave(q)
            mask = valid.long()
            prefix_len = valid.shape[1] - inp.shape[1]
            logits = self._chunked_prefill(lambda a, b: dict(attention_mask=mask[:, :prefix_len + b]), inp, pos,
                                           cache)                               # (Q, 1, V)

            def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
                nonlocal mask
                mask = torch.cat([mask, mask.new_ones(q, 1)], 1)
                return self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, -1:] + step,
                                  past_key_values=cache, use_cache=True).logits

            return lambda: self._greedy(logits, step_fn, q, max_new_tokens, ignore_eos, eos)
        slot = static
        try:
            with self._shared_prefix_attention(cache, slot):
                logits, step_fn = self._static_decoder(slot, cache, inp, valid, pos, max_new_tokens,
                                                       graph=decode == "graph")
        except BaseException:
            self.decode_slots().release(slot)
            raise

        def decode_all() -> list[list[int]]:
            try:
                with self._shared_prefix_attention(cache, slot):   # eager steps attend to this prefix
                    return self._greedy(logits, step_fn, q, max_new_tokens, ignore_eos, eos)
            finally:
                self.decode_slots().release(slot)                  # the next batch of its bucket may take it
        # a batch never decoded (another budget's answer failed first) gives its slot back when dropped
        weakref.finalize(decode_all, DecodeSlotPool.release, slot)
        return decode_all

    def _repeated_prefix(self, cache, rows: int):
        """A new ``DynamicCache`` holding the prefix keys/values of ``cache`` (batch 1) repeated to ``rows`` rows;
        ``cache`` is left as it is."""
        from transformers import DynamicCache

        out = DynamicCache(config=self.model.config.get_text_config())
        for i, layer in enumerate(cache.layers):
            out.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), i)
        return out

    def _chunked_prefill(self, mask_of: Callable[[int, int], dict], inp: torch.Tensor, pos: torch.Tensor,
                         cache) -> torch.Tensor:
        """Prefill the (Q, n) suffix ``inp`` into ``cache`` in causal query chunks of at most ``answer_chunk``
        tokens (:func:`algorithms.answer_batches.query_chunks`; one chunk, the whole suffix, when it fits): chunk
        ``[a, b)`` attends to the cached prefix, the earlier chunks and itself, with the mask arguments
        ``mask_of(a, b)``. Only the last chunk goes through ``lm_head``, at its last position (:meth:`_last_logits`).

        The masks stay dense, one per chunk (issue 44 item 2): ``dynamic`` hands transformers a 2-D mask, from which
        its sdpa path builds a boolean (Q, 1, b - a, L + b) mask (torch's SDPA converts it to an additive float mask
        of that shape inside each layer, the ``aten::where`` of the issue's profile); ``static`` builds its additive
        (Q, 1, b - a, n + R) suffix-region mask itself (the prefix part takes none, :mod:`.shared_prefix`). Neither
        can be replaced by a causal flag or lengths in transformers 5.23's sdpa path on torch 2.14:

        * a chunk after cached keys needs a *lower-right* causal mask (query ``j`` sees keys up to ``L + a + j``);
          SDPA's ``is_causal`` is upper-left aligned (it would hide every key after the chunk's own width), so
          ``masking_utils._ignore_causal_mask_sdpa`` returns the mask unless ``q_length == 1`` or ``q_length ==
          kv_length`` -- never true for a chunk after a cache. ``torch.nn.attention.bias.causal_lower_right`` is
          taken without a mask only by the CUDA flash / memory-efficient kernels; on the CPU torch materializes it
          (``CausalBias._materialize``) as the same (b - a) x (L + b) boolean;
        * rows of a batch are left-padded inside the suffix region: which keys are pads differs per row, and SDPA
          has no per-row key-length argument (transformers' padding-free / varlen paths need ``flash_attention_2``);
        * the ``static`` suffix part is explicit float32 math (:func:`.shared_prefix._partial_math`), whose scores
          (Q, Hkv, G (b - a), n + R) are H times the mask's size: the mask is not its peak.

        What bounds them instead: ``answer_chunk`` caps rows x chunk columns, so a mask holds at most
        ``answer_chunk x (L + n)`` entries, linear in the question (2,048 x 27k booleans, 55 MB, for the 25k-token
        question), where the unchunked prefill's was ``Q x n x (L + n)``.

        Returns:
            logits (Q, 1, V) of each row's last suffix position.
        """
        chunks = query_chunks(inp.shape[0], inp.shape[1], self.answer_chunk)
        for a, b in chunks[:-1]:
            self.model.model(input_ids=inp[:, a:b], position_ids=pos[:, a:b], past_key_values=cache, use_cache=True,
                             **mask_of(a, b))
        a, b = chunks[-1]
        if len(chunks) == 1:                        # the whole suffix (the very tensors, as before chunking)
            return self._last_logits(input_ids=inp, position_ids=pos, past_key_values=cache, use_cache=True,
                                     **mask_of(a, b))
        return self._last_logits(input_ids=inp[:, a:b], position_ids=pos[:, a:b], past_key_values=cache,
                                 use_cache=True, **mask_of(a, b))
