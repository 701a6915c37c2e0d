"""Answering a (video, budget)'s questions with budgeted VideoLLaMA3: one prefilled prefix, greedy decoding, graph replay.

Legend: L prefix tokens, Q question rows answered together, n the longest question suffix, R decode steps, V vocab.

Three paths give the same greedy tokens (DESIGN §3.7): :meth:`SharedPrefixAnswering.answer_from_scratch` (the
reference: the whole prompt in one pass), :meth:`~SharedPrefixAnswering.answer_all` (one prefilled prefix, one
question at a time) and :meth:`~SharedPrefixAnswering.answer_batched` (all questions together; ``static``/``graph``
decoding attends to the batch-1 prefix cache through :mod:`models.videollama3.shared_prefix`, with the decode step
optionally captured once as a CUDA graph).

:class:`SharedPrefixAnswering` is one of the parts composed by :class:`models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from algorithms.errors import SettingError
from ..kernels import host_to_device
from ..vision_attention import sdpa_without_cudnn
from .layout import VideoPrompt

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


class SharedPrefixAnswering:
    """Answer questions greedily from one prefilled video prefix: one by one, or batched with shared-prefix attention
    and a fixed-shape (optionally CUDA-graph) decode step.

    A part of :class:`~models.videollama3.model.BudgetedVideoLlama3`, which sets the attributes read here:
    ``model``, ``tokenizer``, ``eos_ids``, ``_fused``, ``device``/``dtype``, and provides ``question_ids`` and
    ``embed`` (:class:`~models.videollama3.layout.PromptLayout`).
    """

    # decode-step kinds a CUDA graph was captured for in this process: (model, dtype, fused kernels on, ``q == 1``;
    # PyTorch specializes size-1 dimensions, so a one-row step may compile the fused kernels anew); a capture of a
    # kind seen before skips the warm-up (nothing is left to compile or initialise lazily)
    _graph_warm: set = set()

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
    def _shared_prefix_attention(self, cache):
        """Inside the block the LLM attends through :mod:`models.videollama3.shared_prefix` over ``cache`` (the prefill's)."""
        from . import shared_prefix

        name = shared_prefix.register()
        text_cfg = self.model.config.get_text_config()
        old = text_cfg._attn_implementation
        self.model.set_attn_implementation({"text_config": name})
        try:
            with shared_prefix.shared_prefix(cache.layers):
                yield
        finally:
            self.model.set_attn_implementation({"text_config": old})

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
        # and give its memory back, once per (video, budget)
        cuda_graph = torch.cuda.CUDAGraph()
        capture = torch.cuda.Stream()
        capture.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(capture):
                cuda_graph.capture_begin()
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

    def _static_decoder(self, sc, inp: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, max_new_tokens: int,
                        graph: bool):
        """Suffix prefill + a fixed-shape decode step over the suffix-only ``StaticCache`` ``sc`` (optionally a replayed
        CUDA graph), attending to the shared prefix through :mod:`models.videollama3.shared_prefix` (call inside
        :meth:`_shared_prefix_attention`).

        Layout of the static cache per row: ``[suffix (left-padded to n) | decode steps]``; the prefix stays in the
        prefill's batch-1 cache. The mask covers the suffix region only: an additive 4-D ``(Q, 1, 1, n + R)``
        buffer whose column for the step's own key is opened in place before each step, so the step itself has
        fixed shapes and addresses (what a CUDA graph needs).

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
        allowed = key_ok[:, None, :] & (keys[None, None, :] <= query_at[None, :, None])  # (Q, n, total)
        mask = torch.zeros(q, 1, longest, total, dtype=dtype, device=dev).masked_fill(~allowed[:, None], neg)
        tok_buf = torch.zeros(q, 1, dtype=torch.long, device=dev)
        pos_buf = pos[:, -1:] + 1
        mask_buf = torch.zeros(q, 1, 1, total, dtype=dtype, device=dev).masked_fill(
            ~(key_ok & (keys[None] < s0))[:, None, None], neg)

        def forward() -> torch.Tensor:
            return self.model(input_ids=tok_buf, attention_mask={"full_attention": mask_buf}, position_ids=pos_buf,
                              past_key_values=sc, use_cache=True).logits

        run = forward
        if graph and max_new_tokens > 1:
            warm_key = (id(self.model), self.dtype, self._fused, q == 1)
            replay = self._capture_step(forward, sc, warm=warm_key not in SharedPrefixAnswering._graph_warm)
            if replay is not None:
                # later captures skip the warm-up: lazy initialisation (cuBLAS handles, workspaces, compiled
                # kernels) is done
                SharedPrefixAnswering._graph_warm.add(warm_key)
                # The graph holds raw addresses of what the step reads and writes: the suffix cache's keys, values
                # and write positions, and the step's token / position / mask buffers (``forward``'s closure holds
                # them all). Nothing else refers to the suffix cache once the caller returns, so without this
                # reference its memory went back to the allocator while the graph still wrote into it: a write
                # position reused by, e.g., the next step's argmax made ``index_copy_`` write out of bounds (the
                # device-side assert of 2026-12-02, also under CUDA_LAUNCH_BLOCKING=1).
                run = functools.partial(_replay_keeping, replay, (forward, sc))
        # the suffix prefill is launched after the capture: recording the graph is host work that overlaps the prefix
        # prefill on the GPU, while the ~1,000 launches of an eager suffix prefill fill the driver's command queue and
        # would block the host until the GPU drains it (measured: the capture then added ~40 ms per (video, budget)).
        # The graph reads the cache write position on the device, so it does not matter that it was recorded first.
        logits = self._last_logits(input_ids=inp, attention_mask={"full_attention": mask}, position_ids=pos,
                                   past_key_values=sc, use_cache=True)

        def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
            tok_buf.copy_(nxt[:, None])
            if step > 1:
                pos_buf.add_(1)
            mask_buf[..., s0 + step - 1] = 0                                   # the step's own key
            return run()

        return logits, step_fn

