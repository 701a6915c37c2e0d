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

``baseline_run: <folder>`` (seed 000 ``--baseline_run``, 000:1014 / 1342): the baseline records come from that
finished run folder instead (a plain predict's ``b<B>/`` records or an ablation's ``base_b<B>/``,
:func:`callbacks.baseline_run.load_baseline_run`): every job whose LLM input equals the baseline's, ``base`` itself
included (seed ``reuse = eff is BASE and not args.no_reuse``), copies the folder's record of the question
(``dict(base_recs[b][qid], variant=vname, reused=True)``), so the baseline's LLM never runs in this run. The folder
is checked before anything is written (settings of its ``run.json``, decode budget, a record for every question at
every budget; :meth:`LayoutAblationQA.check_before_output`), and each copied record's plan (mode, grid, groups,
frames) must be the one this run planned for the baseline, else the run stops naming the folder, question and field.
``null`` (default) keeps the in-run baseline above.

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
from pathlib import Path

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

# the plan fields of a record that a copied baseline record must share with this run's baseline layout
PLAN_FIELDS = ("mode", "hw", "raw_hw", "n_groups", "n_compressed", "n_raw_frames", "vision_tokens", "seg_lens")


class BaselinePlanMismatch(AssertionError):
    """A baseline-run record describes another plan than this run's baseline (the run stops: its records would not
    be this run's ``base``; seed 000 asserts likewise on missing records)."""

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
        baseline_run: a finished run folder whose records are the baseline (seed 000 ``--baseline_run``; see the
            module docstring); ``None`` (default): the baseline is computed in this run.
        **kwargs: every argument of :class:`~lightning_modules.budgeted_qa.BudgetedQA` except ``budgets`` (the
            jobs' budgets): ``model_path``, ``raw_mode``, ``raw_max_tokens``, ``max_new_tokens``, ``answer_mode``...
            (forwarded, so the YAML and ``--print_config`` list them as for plain predict).
    """

    # ``no_reuse`` absent from a run.json written before it was recorded: that folder was written with reuse (the
    # default), so a ``no_reuse: true`` run on it is refused instead of skipping its reused records
    RECORD_DEFAULTS = {**BudgetedQA.RECORD_DEFAULTS, "baseline_run": None, "no_reuse": False}

    def __init__(self, jobs: str = "base:256", no_reuse: bool = False, decode_budget: int = 16384,
                 baseline_run: str | None = None, **kwargs):
        try:
            pairs = parse_jobs(jobs)
        except ValueError as e:   # a setting: one line at the CLI (jsonargparse's model union would bury it)
            raise SettingError(f"model.init_args.jobs: {e}") from None
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
        if baseline_run is not None and (not isinstance(baseline_run, (str, Path)) or not str(baseline_run)):
            raise SettingError(f"model.init_args.baseline_run must be a run folder or null, got {baseline_run!r}")
        self.baseline_run = None if baseline_run is None else Path(baseline_run)
        self.baseline_records: dict[int, dict[str, dict]] | None = None   # budget -> qid -> record

    def record_settings(self) -> dict:
        """:meth:`BudgetedQA.record_settings` plus ``decode_budget`` (the frames of every job), ``no_reuse`` (whether
        the records of jobs equal to the baseline are copies, ``reused: true``, or were answered by the LLM; a folder
        resumes only with its own value) and, when given, ``baseline_run`` (where the reused records come from)."""
        out = {**super().record_settings(), "decode_budget": self.decode_budget, "no_reuse": self.no_reuse}
        if self.baseline_run is not None:
            out["baseline_run"] = str(self.baseline_run.resolve())
        return out

    def check_before_output(self, trainer, settings: dict, defaults: dict) -> None:
        """Read and check ``baseline_run`` before the writer creates anything (called by
        :class:`callbacks.jsonl_writer.JsonlPredictionWriter` first thing in its ``setup``).

        Raises:
            callbacks.baseline_run.BaselineRunError: naming the folder and the setting, budget or video.
            FileNotFoundError: ``model_path`` is not a checkpoint directory (:meth:`BudgetedQA.check_before_output`).
        """
        super().check_before_output(trainer, settings, defaults)
        if self.baseline_run is None:
            return
        from callbacks.baseline_run import load_baseline_run

        dm = getattr(trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "tasks"):
            raise SettingError("model.init_args.baseline_run needs the video QA datamodule (its questions are checked)")
        questions = [(t.video_id, q.qid) for t in dm.tasks(list(self.jobs)) for q in t.questions]
        self.baseline_records = load_baseline_run(self.baseline_run, settings, defaults, dm.benchmark,
                                                  self.budgets, questions, self.decode_budget,
                                                  getattr(dm, "canonical_settings", None))
        log.info("baseline_run %s: %d records at budgets %s", self.baseline_run,
                 sum(len(r) for r in self.baseline_records.values()), self.budgets)

    def on_predict_start(self) -> None:
        if self.baseline_run is not None and self.baseline_records is None:   # no writer ran the check
            from callbacks.jsonl_writer import run_settings

            self.check_before_output(self.trainer, *run_settings(self.trainer, self))
        super().on_predict_start()

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

        # which layouts run the LLM, for which questions; which jobs copy the baseline (of this run, or of
        # baseline_run: then base itself too, seed 000 ``reuse = eff is BASE and not args.no_reuse``)
        run_qids: dict[tuple[str, int], set[str]] = {}
        reuse: dict[str, tuple[str, int]] = {}
        same_as_base: dict[str, bool] = {}
        from_run = self.baseline_records is not None
        for j in todo_jobs:
            v, b = self._job_key[j]
            lj, base = layouts[(v, b)], layouts[(BASELINE, b)]
            same_as_base[j] = same_llm_input(lj.layout, base.layout)
            qids = {q.qid for q in questions if j in item["jobs"].get(q.qid, ())}
            src = (BASELINE, b) if (same_as_base[j] and not self.no_reuse) else (v, b)
            if from_run and src == (BASELINE, b):
                reuse[j] = src
                continue
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
                if from_run and j in reuse:
                    rec = self._from_baseline_run(q.qid, layouts[src])
                else:
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

    def _from_baseline_run(self, qid: str, base: LayoutJob) -> dict:
        """Seed 000:1342 ``rec = dict(base_recs[b][s["qid"]], ...)``: the baseline run's record of the question,
        its plan checked against this run's baseline layout, with this run's layout fields (``capped``,
        ``n_frames_kept``, ``raw_grid``, ``group_substitute``, ``group_grid``) that a plain predict record lacks.

        Raises:
            BaselinePlanMismatch: the record's plan or frame count is not this run's baseline's.
        """
        rec = dict(self.baseline_records[base.budget][qid])
        if rec.get("error"):   # copied as the seed copies any record (its video failed in the baseline run)
            return rec
        stats = base.layout.stats()
        want = {**{k: stats[k] for k in PLAN_FIELDS}, "n_frames": len(base.frame_idx)}
        got = {**{k: rec.get(k) for k in PLAN_FIELDS}, "n_frames": (rec.get("video_info") or {}).get("n_frames")}
        bad = [f"{k}: {got[k]!r} there, {want[k]!r} here" for k in want if got[k] != want[k]]
        if bad:
            raise BaselinePlanMismatch(f"baseline_run {self.baseline_run}: video {rec.get('video')} qid {qid} at "
                                       f"budget {base.budget}: its baseline plan differs ({'; '.join(bad)})")
        rec.update(capped=stats["capped"], n_frames_kept=stats["n_frames_kept"], raw_grid=list(base.layout.raw_grid),
                   group_substitute=base.layout.group_substitute,
                   group_grid=list(base.layout.group_grid) if base.layout.group_grid else None)
        return rec

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
