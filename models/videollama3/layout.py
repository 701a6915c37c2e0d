"""The LLM input layout of budgeted VideoLLaMA3: the chat template, the shared prefix's ids and vision rows, the question.

Legend: K rows per compressed group, G_c compressed groups, N vision rows in the LLM input, D LLM hidden size.

LLM input (DESIGN §3.6): blocks in time order inside the user turn, before the question. A raw frame is
``Time {t:.1f}s:`` + its rows, then ``,`` (``\\n`` after the last block); a compressed group is
``Time:{a}s-{b}s:<|compression_start|>`` + K rows + ``<|compression_end|>`` (``\\n`` after it when last), with
``a``/``b`` the first/last frame times as ``int(round(t))`` whole seconds (seed 001, half to even). Vision rows enter as ``inputs_embeds`` at
``<|video_pad|>`` positions; dataset text is tokenized with ``split_special_tokens=True``, so no question, option
or subtitle can create a placeholder or end the user turn.

:class:`PromptLayout` is one of the parts composed by :class:`models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.budget import Plan
from ..kernels import host_to_device

COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
_VIDEO_MARK = "\x00VIDEO\x00"
_TEXT_MARK = "\x00TEXT\x00"


def group_second(x: float) -> int:
    """Whole seconds of a compressed group's label, as seed 001 ``build_video`` computes them:
    ``sec = [int(round(t)) for t in ts]`` (Python's ``round``: half to even, 2.5 -> 2, 3.5 -> 4)."""
    return int(round(x))


@dataclass
class VideoPrompt:
    """The shared prefix of one (video, budget): token ids with placeholders, and the vision rows for them.

    Attributes:
        ids: (L,) prefix token ids (system + user header + video blocks, ending with the video's last separator).
        vision_embeds: (N, D) rows for the N placeholder positions of ``ids``, in order.
        last_text: the text of the prefix's last text piece (after the last vision row), tokenized alone at the
            end of ``ids``; the question is appended to it for the fallback check of DESIGN §3.7.
        last_text_len: number of tokens of that last piece at the end of ``ids``.
        answer_prefix: text put after the assistant header, before the answer (MLVU's ``"Best Option: ("``);
            ``""`` for none (:meth:`PromptLayout.with_chat`).
    """

    ids: torch.Tensor
    vision_embeds: torch.Tensor
    last_text: str
    last_text_len: int
    answer_prefix: str = ""




class PromptLayout:
    """Lay out the LLM input: the chat template around the video, the shared prefix, the question's ids, the
    ``inputs_embeds`` with vision rows at the placeholders.

    A part of :class:`~models.videollama3.model.BudgetedVideoLlama3`, which sets the attributes read here:
    ``model``, ``tokenizer``, ``placeholder_id`` (the ``<|video_pad|>`` id), ``_template`` (this class's
    :meth:`_split_chat_template` of the default system message), ``add_system_prompt`` and ``device``.
    """

    # ------------------------------------------------------------------ text
    def _split_chat_template(self, system: str | None = None) -> tuple[str, str, str]:
        """The chat template rendered around a video marker and a text marker: ``(head, mid, tail)``; ``system``:
        a system message before the user turn (``None``: the template's default).

        Rendered as seed 001 ``prompt_embeds`` does, ``apply_chat_template(msgs, tokenize=False,
        add_generation_prompt=True, add_system_prompt=True)``: VideoLLaMA3's template
        (chicheng567/OnlineLong@0b046341:videollama3/model/processor.py:DEFAULT_CHAT_TEMPLATE) writes its system
        turn ``<|im_start|>system\nYou are VideoLLaMA3 created by Alibaba DAMO Academy, a helpful assistant to help
        people understand images and videos.<|im_end|>\n`` only when ``add_system_prompt`` is set; templates that
        do not read the flag (plain ChatML) render unchanged.

        ``add_system_prompt`` (attribute, :meth:`set_system_prompt`) ``False`` renders as VideoLLaMA3's own
        evaluation does (DAMO-NLP-SG/VideoLLaMA3@05cee23d:evaluation/benchmarks/base.py:BaseVideoEvalDataset.__getitem__:
        ``self.processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)``, no flag:
        no system turn)."""
        msgs = [{"role": "user", "content": _VIDEO_MARK + _TEXT_MARK}]
        if system is not None:
            msgs.insert(0, {"role": "system", "content": system})
        try:
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                      add_system_prompt=self.add_system_prompt)
        except Exception as e:  # noqa: BLE001 - jinja2's errors only (its sandbox, syntax, undefined names)
            if not type(e).__module__.startswith("jinja2"):
                raise
            from algorithms.errors import CheckpointError

            where = getattr(self.tokenizer, "name_or_path", "") or "the checkpoint"
            what = ("does something transformers' sandbox forbids, so it was refused, not run"
                    if type(e).__name__ == "SecurityError" else "cannot be rendered")
            raise CheckpointError(f"{where}: the chat template (chat_template.jinja / tokenizer_config.json) {what} "
                                  f"({type(e).__name__}: {e}); use the template the checkpoint was released with"
                                  ) from e
        if _VIDEO_MARK not in text or _TEXT_MARK not in text:
            raise ValueError("the tokenizer's chat template does not place string user content verbatim")
        if system is not None and system not in text.split(_VIDEO_MARK)[0]:
            raise ValueError("the tokenizer's chat template does not place a string system message verbatim")
        head, rest = text.split(_VIDEO_MARK)
        mid, tail = rest.split(_TEXT_MARK)
        return head, mid, tail

    def set_system_prompt(self, on: bool) -> "PromptLayout":
        """Render the chat template with ``add_system_prompt=on``: ``True`` (default) as seed 001
        ``prompt_embeds`` (VideoLLaMA3's system turn), ``False`` as VideoLLaMA3's ``evaluation/`` (none); prompts
        built afterwards use it."""
        if not isinstance(on, bool):
            raise TypeError(f"add_system_prompt must be a bool, got {on!r}")
        self.add_system_prompt = on
        self._template = self._split_chat_template()
        return self

    def with_chat(self, prompt: VideoPrompt, system: str | None = None, answer_prefix: str = "",
                  pre_media_text: str = "") -> VideoPrompt:
        """``prompt`` with the chat template's head rendered with the system message ``system`` (``None``: the
        template's default) and ``answer_prefix`` put after the assistant header (a released prompt's
        ``"Best Option: ("``, MLVU ``choice_bench.py``). The same ids a prefix built with that head would have: the
        head is tokenized alone at the start of every prefix (:meth:`build_prompt`). ``pre_media_text``: a prompt's
        text before the video in the user turn (VLMEvalKit WorldSense's SYS item), tokenized with the head.

        Raises:
            ValueError: ``prompt`` does not start with the default head's ids.
        """
        default = self._ids(self._template[0])
        n = len(default)
        if prompt.ids[:n].tolist() != default:
            raise ValueError("the prompt does not start with the chat template's default head")
        head_text = self._split_chat_template(system)[0] if system is not None else self._template[0]
        head = self._ids(head_text + pre_media_text) if (system is not None or pre_media_text) else default
        ids = torch.cat([torch.tensor(head, dtype=prompt.ids.dtype), prompt.ids[n:]])
        return VideoPrompt(ids=ids, vision_embeds=prompt.vision_embeds, last_text=prompt.last_text,
                           last_text_len=prompt.last_text_len, answer_prefix=answer_prefix)

    def _ids(self, text: str, untrusted: bool = False) -> list[int]:
        if not text:
            return []
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=untrusted)["input_ids"]

    def build_prompt(self, plan: Plan, times_s: list[float], raw_rows: torch.Tensor,
                     group_rows: torch.Tensor, groups_as_raw: bool = False,
                     subtitle_slots: list[list[str]] | None = None) -> VideoPrompt:
        """The shared prefix for one (video, budget).

        Args:
            plan: the layout.
            times_s: T frame times (s) of the plan's frames.
            raw_rows: (n_raw_frames, raw_hw, D) projected rows of the raw frames, in time order.
            group_rows: (G_c, K, D) projected rows of the compressed groups, in time order.
            groups_as_raw: layout ablations' compressor swaps (DESIGN §4): each compressed group ``[a, b)`` is
                written as one raw frame, ``Time {t:.1f}s:`` + its rows (no compression tokens), with ``t`` the
                time of its middle frame ``a + (b - a - 1) // 2``; ``group_rows`` is then (G_c, K', D).
            subtitle_slots: T+1 lists, ``[k]`` the subtitle texts that go before frame ``k`` (``[T]`` after the
                last; ``datamodules.benchmarks.subtitles.interleave_slots``). As VideoLLaMA3's LongVideoBench
                evaluation renders them (its chat template: a video chunk ends with ``\n``, a text item follows
                verbatim, the next chunk's ``Time`` right after it): the block before them ends with ``\n``, the
                texts follow with nothing between. An empty text (``""``) is an item too: it ends the chunk
                (``\n``) and adds nothing. A slot inside a compressed group goes after the group.
                Subtitle text is tokenized as dataset text (``split_special_tokens``).

        Returns:
            A :class:`VideoPrompt`.
        """
        head, mid, _ = self._template
        ids: list[int] = self._ids(head)
        embeds = []
        blocks = plan.blocks()
        text = ""
        ri = gi = 0
        cs, ce = (self.tokenizer.convert_tokens_to_ids(t) for t in (COMPRESSION_START, COMPRESSION_END))
        subs = False

        def interleave(text: str, lo: int, hi: int) -> str:   # slots lo..hi-1 after the previous block
            nonlocal subs
            items = [t for k in range(lo, hi) for t in subtitle_slots[k]]
            if not items:      # an empty text is still an item: it closes the video chunk (VideoLLaMA3@05cee23d
                return text    # longvideobench.py:generate_instruction appends every str as a text item)
            subs = True
            return ("\n" if text in (",", "") and lo > 0 else text) + "".join(items)

        done = 0     # slots placed so far
        for bi, (kind, a, b) in enumerate(blocks):
            last = bi == len(blocks) - 1
            if subtitle_slots is not None:
                text, done = interleave(text, done, a + 1), a + 1
            if kind == "raw":
                ids += self._ids(text + f"Time {times_s[a]:.1f}s:", untrusted=subs)
                rows = raw_rows[ri]
                ri += 1
                ids += [self.placeholder_id] * rows.shape[0]
                embeds.append(rows)
                text = "\n" if last else ","
            elif groups_as_raw:
                ids += self._ids(text + f"Time {times_s[a + (b - a - 1) // 2]:.1f}s:", untrusted=subs)
                rows = group_rows[gi]
                gi += 1
                ids += [self.placeholder_id] * rows.shape[0]
                embeds.append(rows)
                text = "\n" if last else ","
            else:
                ids += self._ids(text + f"Time:{group_second(times_s[a])}s-{group_second(times_s[b - 1])}s:",
                                 untrusted=subs) + [cs]
                rows = group_rows[gi]
                gi += 1
                ids += [self.placeholder_id] * rows.shape[0] + [ce]
                embeds.append(rows)
                text = "\n" if last else ""
        if subtitle_slots is not None:
            text = interleave(text, done, len(subtitle_slots))
        text += mid
        last_ids = self._ids(text, untrusted=subs)
        ids += last_ids
        vision = torch.cat(embeds) if embeds else raw_rows.new_zeros(0, raw_rows.shape[-1])
        return VideoPrompt(ids=torch.tensor(ids, dtype=torch.long), vision_embeds=vision, last_text=text,
                           last_text_len=len(last_ids))

    def question_ids(self, prompt: VideoPrompt, question_text: str) -> tuple[list[int], bool]:
        """Token ids that follow the prefix for one question, and whether the prefix is *not* reusable.

        The reference is the whole text after the last vision row (``prompt.last_text + question``) tokenized in
        one piece, as a plain pass would. If its first tokens differ from the prefix's own tokenization of
        ``prompt.last_text`` (a BPE merge across the boundary), the shared prefix cannot be used: the returned ids
        then replace the prefix's last piece, and ``fallback`` is True (DESIGN §3.7).

        The template's tail (user turn end, assistant header) and ``prompt.answer_prefix`` are tokenized together
        after the question, as the one text they are in a plain pass.

        Returns:
            ``(ids, fallback)``: without fallback, the ids to append to the full prefix; with fallback, the ids
            to append to ``prompt.ids[:-prompt.last_text_len]``.
        """
        _, _, tail = self._template
        whole = self._ids(prompt.last_text + question_text, untrusted=True)
        n = prompt.last_text_len
        own = prompt.ids[len(prompt.ids) - n:].tolist() if n else []
        tail_ids = self._ids(tail + prompt.answer_prefix)
        if whole[:n] == own:
            return whole[n:] + tail_ids, False
        return whole + tail_ids, True

    # ------------------------------------------------------------------ LLM
    def embed(self, ids: torch.Tensor, vision_embeds: torch.Tensor) -> torch.Tensor:
        """(L,) ids + (N, D) rows -> (1, L, D) ``inputs_embeds`` with rows at the N placeholder positions.

        Raises:
            ValueError: the placeholder count differs from N.
        """
        mask = ids == self.placeholder_id                       # on the ids' device (the host, as built)
        if int(mask.sum()) != vision_embeds.shape[0]:
            raise ValueError(f"{int(mask.sum())} placeholders for {vision_embeds.shape[0]} vision rows")
        emb = self.model.get_input_embeddings()(host_to_device(ids, self.device))   # a new tensor
        # the rows go in at integer positions copied from the host: a boolean-mask assignment on the device would
        # wait for the GPU (it counts the mask's entries first)
        emb[host_to_device(mask.nonzero().squeeze(1), self.device)] = vision_embeds.to(emb.dtype)
        return emb.unsqueeze(0)

