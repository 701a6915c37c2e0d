"""LayoutAblationQA: the layout-ablation predict job (DESIGN §4, issue 4), one pass over the videos.

Each ``predict_step`` takes one decoded video (decoded once, for the largest budget of the jobs) and answers every
``(variant, budget)`` job still to do on it, from one shared :class:`models.videollama3.EncodeCache` (at most one
encode per frame size; see :mod:`models.videollama3.ablation`). Records go to ``<out_dir>/<variant>_b<B>/<benchmark>/`` through
the usual prediction writer, which also makes the run resumable per (job, qid).

Reuse. The reference of every job is ``base`` at the same budget. A job whose LLM input equals the baseline's
(:func:`algorithms.layouts.same_llm_input`, seed 000's test: not capped, same raw grid, same cut and compressed
groups, and qbase groups or none) does not run the
LLM: its records are the baseline's records for those questions, with ``job`` / ``variant`` set to its own and
``reused: true``. The baseline is therefore *computed even when ``base`` is not requested* (or already written for
these questions, on a resumed run) whenever a job to do reuses it: its layout always (cheap), its LLM answers for
the union of the questions of the jobs that reuse it (those base records are only written when ``base`` itself is
a requested job). ``no_reuse: true`` runs the LLM for every job (``reused`` always false); ``same_as_base`` still
says whether the input equalled the baseline's, so reuse shares can be read from either kind of run.

Record fields: those of plain predict (:class:`lightning_modules.budgeted_qa.BudgetedQA`) with ``variant`` set, plus
``reused``, ``same_as_base``, ``capped`` (the variant's frame cap dropped frames of this video), ``n_frames_kept``,
``raw_grid``, ``group_substitute``, ``group_grid``. ``video_info.n_frames`` is the number of frames the variant
used and ``video_info.capped`` plain predict's flag computed on those frames, so ``base`` records equal plain
predict's in every plain field (``variant`` and ``job`` aside).

Instrumentation: ``video_stats[video_id]`` counts, per video, the items (= decodes: the dataset decodes once per
item), the encode calls ``(grid, n_frames)`` and re-encode calls ``(encode grid, grid, n_frames)`` of the shared
cache, the LLM prefixes built and the jobs reused.
"""
from __future__ import annotations

import logging
import time

from algorithms.layouts import parse_jobs, same_llm_input
from algorithms.budget import K_ROWS
from algorithms.errors import SettingError, check_int
from datamodules.benchmarks.prompts import interleaved_subtitles
from datamodules.benchmarks import Question
from models.videollama3.ablation import (
    BASELINE, LayoutJob, build_layout_prompt, duplicate_encodes, encode_layout_inputs, plan_layout_jobs,
)
from models.videollama3 import EncodeCache

from .budgeted_qa import BudgetedQA, job_name, qa_record

log = logging.getLogger(__name__)


class LayoutAblationQA(BudgetedQA):
    """Layout ablations of budgeted QA: many ``(variant, budget)`` jobs per video from one decode and encode.

    Args:
        jobs: ``variant:budget[:budget…]``, comma-separated (:func:`algorithms.layouts.parse_jobs`), e.g.
            ``"base:256:1024,rho32:1024,sel_merge:1024"``; job names are ``<variant>_b<B>``.
        no_reuse: run the LLM for every job instead of copying the baseline's records where the LLM input is
            the same.
        decode_budget: the budget each video is decoded for (seed 000: ``Videos(todo, 16384)``, whatever the jobs'
            budgets; a job's frames are then ``variant_frames`` of those). ``base`` equals plain predict bit for bit
            where plain predict decodes the same frames (its largest budget 16384, or videos short enough that
            both decode every 1 fps frame).
        **kwargs: every argument of :class:`~lightning_modules.budgeted_qa.BudgetedQA` except ``budgets`` (the
            jobs' budgets): ``model_path``, ``raw_mode``, ``raw_max_tokens``, ``max_new_tokens``, ``answer_mode``...
            (forwarded, so the YAML and ``--print_config`` list them as for plain predict).
    """

    def __init__(self, jobs: str = "base:256", no_reuse: bool = False, decode_budget: int = 16384, **kwargs):
        pairs = parse_jobs(jobs)
        if "budgets" in kwargs:
            raise SettingError("LayoutAblationQA takes its budgets from `jobs`; do not pass `budgets`")
        super().__init__(budgets=sorted({b for _, b in pairs}), **kwargs)
        self.save_hyperparameters()
        self.job_pairs: list[tuple[str, int]] = pairs
        self.no_reuse = bool(no_reuse)
        check_int("model.decode_budget", decode_budget, K_ROWS)
        self.decode_budget = int(decode_budget)
        self._job_key = {job_name(b, v): (v, b) for v, b in pairs}
        self.video_stats: dict[str, dict] = {}

    @property
    def jobs(self) -> dict[str, int]:
        """Job name ``<variant>_b<B>`` -> budget, in the order given."""
        return {job_name(b, v): b for v, b in self.job_pairs}

    def frame_sizing(self) -> None:
        """``None``: the variants choose their own frames and sizes, so videos are held at the decode size."""
        return None

    def predict_step(self, item: dict, batch_idx: int = 0) -> list[dict]:
        records = super().predict_step(item, batch_idx)
        for r in records:
            if "error" in r:  # error records of BudgetedQA carry no variant
                r["variant"] = self._job_key[r["job"]][0]
                r["reused"] = False
        return records

    def _answer_video(self, item: dict) -> list[dict]:
        hp = self.hparams
        t0 = time.perf_counter()
        todo_jobs = [j for j in self.jobs if any(j in js for js in item["jobs"].values())]
        questions = [Question(**q) for q in item["questions"]]
        cache = EncodeCache(self.vlm, item["frames"].to(self.device), hp.encode_chunk_frames)
        layouts = plan_layout_jobs(cache, [self._job_key[j] for j in todo_jobs], raw_mode=hp.raw_mode,
                                   raw_max_tokens=hp.raw_max_tokens, max_tokens_per_frame=hp.max_tokens_per_frame)

        # which layouts run the LLM, for which questions; which jobs copy the baseline
        run_qids: dict[tuple[str, int], set[str]] = {}
        reuse: dict[str, tuple[str, int]] = {}
        same_as_base: dict[str, bool] = {}
        for j in todo_jobs:
            v, b = self._job_key[j]
            lj, base = layouts[(v, b)], layouts[(BASELINE, b)]
            same_as_base[j] = same_llm_input(lj.layout, base.layout)
            qids = {q.qid for q in questions if j in item["jobs"].get(q.qid, ())}
            src = (BASELINE, b) if (same_as_base[j] and not self.no_reuse) else (v, b)
            if src != (v, b):
                reuse[j] = src
            run_qids.setdefault(src, set()).update(qids)
        to_run = sorted(run_qids, key=lambda k: (k[1], k[0]))
        encode_layout_inputs(cache, [layouts[k] for k in to_run])
        dup = duplicate_encodes(cache)
        if dup:
            log.warning("video %s: grids encoded more than once: %s", item["video_id"], dup)
        t1 = time.perf_counter()

        answer = self.answerer()   # plain predict's decode path (base with reuse off is bit-identical)
        by_layout: dict[tuple[str, int], dict[str, dict]] = {}
        for key in to_run:
            lj = layouts[key]
            todo = [q for q in questions if q.qid in run_qids[key]]
            prompt = build_layout_prompt(self.vlm, cache, lj, item["times_s"], hp.raw_mode,
                                         interleaved_subtitles(questions))
            texts, names = self.prompts(todo, [item["times_s"][i] for i in lj.frame_idx])
            answers = self.answer_texts(answer, prompt, texts, names)
            by_layout[key] = {q.qid: self._record(item, q, a, lj, name) for q, a, name in zip(todo, answers, names)}
        t2 = time.perf_counter()

        records = []
        for j in todo_jobs:
            v, b = self._job_key[j]
            src = reuse.get(j, (v, b))
            for q in questions:
                if j not in item["jobs"].get(q.qid, ()):
                    continue
                rec = dict(by_layout[src][q.qid])
                rec.update(job=j, variant=v, reused=j in reuse, same_as_base=same_as_base[j])
                records.append(rec)

        st = self.video_stats.setdefault(item["video_id"], {"n_items": 0, "encode_calls": [], "reencode_calls": [],
                                                            "n_prefixes": 0, "n_jobs": 0, "n_reused_jobs": 0})
        st["n_items"] += 1
        st["encode_calls"] += list(cache.encode_calls)
        st["reencode_calls"] += list(cache.reencode_calls)
        st["n_prefixes"] += len(to_run)
        st["n_jobs"] += len(todo_jobs)
        st["n_reused_jobs"] += len(reuse)
        log.info("video %s: %d jobs, %d LLM prefixes (%d jobs reuse the baseline), encodes %s, re-encodes %s",
                 item["video_id"], len(todo_jobs), len(to_run), len(reuse), cache.encode_calls, cache.reencode_calls)
        self.last_stage_seconds = {"encode": cache.encode_seconds, "plan_build": t1 - t0 - cache.encode_seconds,
                                   "answer": t2 - t1}
        return records

    def _record(self, item: dict, q: Question, a, lj: LayoutJob, template: str) -> dict:
        """One record, with the plain-predict fields computed exactly as :class:`BudgetedQA` does (an unanswered
        question's error record as :func:`~lightning_modules.budgeted_qa.qa_record` gives it)."""
        stats = lj.layout.stats()
        if getattr(a, "error", None):
            return qa_record(item, q, a, stats, len(lj.frame_idx), job_name(lj.budget, lj.variant), lj.budget,
                             lj.variant, template)
        return {
            **qa_record(item, q, a, stats, len(lj.frame_idx), job_name(lj.budget, lj.variant), lj.budget, lj.variant,
                        template),
            "reused": False, "same_as_base": lj.variant == BASELINE, "capped": stats["capped"],
            "n_frames_kept": stats["n_frames_kept"], "raw_grid": list(lj.layout.raw_grid),
            "group_substitute": lj.layout.group_substitute,
            "group_grid": list(lj.layout.group_grid) if lj.layout.group_grid else None,
        }
