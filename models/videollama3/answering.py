"""Answering a (video, budget)'s questions with budgeted VideoLLaMA3: one prefilled prefix, greedy decoding, graph replay.

Legend: L prefix tokens, Q question rows answered together, n the longest question suffix, R decode steps, V vocab.

Three paths give the same greedy tokens (DESIGN §3.7): :meth:`SharedPrefixAnswering.answer_from_scratch` (the
reference: the whole prompt in one pass), :meth:`~SharedPrefixAnswering.answer_all` (one prefilled prefix, one
question at a time) and :meth:`~SharedPrefixAnswering.answer_batched` (all questions together; ``static``/``graph``
decoding attends to the batch-1 prefix cache through :mod:`models.videollama3.shared_prefix`, with the decode step
optionally captured once as a CUDA graph, :mod:`models.videollama3.batched_decode`).

:class:`SharedPrefixAnswering` is one of the parts composed by :class:`models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from algorithms.errors import SettingError
from ..kernels import host_to_device
from ..vision_attention import sdpa_without_cudnn
from .batched_decode import BatchedDecoding
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
    """

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
                            ignore_eos: bool = False) -> Answer:
        """Reference path: prefill the whole prompt (prefix + question) in one pass and decode greedily
        (``ignore_eos``: exactly ``max_new_tokens`` tokens)."""
        q_ids, fallback = self.question_ids(prompt, question_text)
        base = prompt.ids if not fallback else prompt.ids[: len(prompt.ids) - prompt.last_text_len]
        full = torch.cat([base, torch.tensor(q_ids, dtype=torch.long)])
        error = self.context_error(full.numel(), max_new_tokens)
        if error:
            return self._skipped(full.numel(), fallback, error)
        emb = self.embed(full, prompt.vision_embeds)
        return self._answer(self._generate(full, max_new_tokens, inputs_embeds=emb, ignore_eos=ignore_eos), full.numel(),
                            fallback)

    @torch.no_grad()
    def answer_all(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                   ignore_eos: bool = False) -> list[Answer]:
        """Answer every question of a (video, budget) from one prefilled prefix (DESIGN §3.7).

        The prefix is prefilled once into a ``DynamicCache``; each question then runs ``generate`` on the full
        ids, which only feeds the uncached question tokens, and the cache is cropped back to the prefix.
        A question whose text merges with the prefix's last piece falls back to :meth:`answer_from_scratch`.
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
                answers.append(self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos))
                continue
            error = self.context_error(prefix_len + len(q_ids), max_new_tokens)
            if error:
                answers.append(self._skipped(prefix_len + len(q_ids), False, error))
                continue
            full = torch.cat([prompt.ids, torch.tensor(q_ids, dtype=torch.long)])
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

        The prefix cache (batch 1) is repeated to Q rows; the question suffixes are left-padded *inside the
        suffix region* so they end in the same column, with a 2-D attention mask hiding the pads and explicit
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
                answers[i] = self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos)
                continue
            error = self.context_error(prompt.ids.numel() + len(ids), max_new_tokens)
            if error:
                answers[i] = self._skipped(prompt.ids.numel() + len(ids), False, error)
            else:
                batch.append(ids)
                rows.append(i)
        if not batch:
            return lambda: answers
        dev = self.device
        prefix_len = prompt.ids.numel()
        q = len(batch)
        longest = max(len(x) for x in batch)
        pad = self.tokenizer.pad_token_id or 0
        inp = torch.full((q, longest), pad, dtype=torch.long)
        valid = torch.zeros(q, prefix_len + longest, dtype=torch.bool)   # keys a row may attend (pads excluded)
        valid[:, :prefix_len] = True
        pos = torch.full((q, longest), prefix_len, dtype=torch.long)
        for r, ids in enumerate(batch):
            n = len(ids)
            inp[r, longest - n:] = torch.tensor(ids)
            valid[r, prefix_len + longest - n:] = True
            pos[r, longest - n:] = prefix_len + torch.arange(n)
        # everything the host sends is on the device before the prefill is launched: from here to the final read of
        # the tokens nothing waits for the GPU, so the host-side work of the answer stage overlaps the prefill
        inp, valid, pos = (host_to_device(t, dev) for t in (inp, valid, pos))
        eos = host_to_device(torch.tensor(self.eos_ids), dev)
        static = None
        if decode != "dynamic":
            static = self._suffix_cache(q, longest + max_new_tokens)
        cache = self.prefill(prompt, max_new_tokens)                            # batch 1
        if decode == "dynamic":
            if q > 1:
                cache.batch_repeat_interleave(q)
            mask = valid.long()
            logits = self._last_logits(input_ids=inp, attention_mask=mask, position_ids=pos, past_key_values=cache,
                                       use_cache=True)                          # (Q, 1, V)

            def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
                nonlocal mask
                mask = torch.cat([mask, mask.new_ones(q, 1)], 1)
                return self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, -1:] + step,
                                  past_key_values=cache, use_cache=True).logits

            def decode_all() -> list[list[int]]:
                return self._greedy(logits, step_fn, q, max_new_tokens, ignore_eos, eos)
        else:
            with self._shared_prefix_attention(cache):
                logits, step_fn = self._static_decoder(static, inp, valid, pos, max_new_tokens,
                                                       graph=decode == "graph")

            def decode_all() -> list[list[int]]:
                with self._shared_prefix_attention(cache):   # eager steps attend to this prefix (a graph has it)
                    return self._greedy(logits, step_fn, q, max_new_tokens, ignore_eos, eos)

        def finish() -> list[Answer]:
            gen = decode_all()
            for r, i in enumerate(rows):
                toks = gen[r]
                if not ignore_eos:
                    for j, t in enumerate(toks):
                        if t in self.eos_ids:
                            toks = toks[:j]
                            break
                answers[i] = self._answer(toks, prefix_len + len(batch[r]), False)
            return answers

        return finish
