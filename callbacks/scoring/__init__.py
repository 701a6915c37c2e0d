"""Scoring of prediction records: accuracies per job and parser, benchmark breakdowns, ``scores.json``, plots and
the console summary.

Modules: :mod:`.scores` (reading records, groups, parsers, intervals, differences, costs), :mod:`.release` (each
benchmark's released aggregation and headline name), :mod:`.summary` (the released figures, the ablation matrix and
the pruning table, shared by the console and ``report.html``), :mod:`.console` (the printed table), :mod:`.plots`
(PNG figures), :mod:`.output` (``scores.json`` + plots + ``report.html``), :mod:`.callback`
(:class:`ScoreOnPredictEnd`), :mod:`.command` (``python -m callbacks.scoring``). Every public name is re-exported
here.

Records are the jsonl lines written by the prediction writer under ``<out_root>/<job>/<benchmark>/*.jsonl``
(``job`` e.g. ``b1024`` or ``<variant>_b<B>``), one per (question, budget[, variant]) with ``qid, video, budget,
variant, answer, pred, pred_robust, response, meta{benchmark, template, ...}``, or ``error`` instead of the answer
fields when the question failed.

Protocol (every choice is visible in ``scores.json``):

* **Groups**: one per ``(benchmark, job, variant, budget)``; ``benchmark`` is ``meta["benchmark"]`` (else the
  folder name), ``job`` is the record's ``job`` key (else the first folder under ``out_root``).
* **De-duplication**: a qid seen twice in a group (restarts, overlapping shards) counts once; the *first* record
  wins, in sorted-path then line order, except that an answered record replaces an earlier error record (the
  writer retries failed questions on restart and appends the new record after the error, which stays as the
  audit trail), or comes before it (a later rank's file: the error of a two-process run, answered on resume by
  rank 0). ``n_duplicates`` reports how many were dropped, ``n_retried`` how many errors were answered.
* **Rules** (:mod:`algorithms.choice`): ``official`` is the benchmark's own released rule
  (:func:`algorithms.choice.official_rule`: ``videomme``, ``mlvu``, ``lvb``, ``worldsense``; its name is the
  parser's ``rule``), ``robust`` the robust parser; ``rules=[...]`` (CLI ``--rules``) adds any rule of
  :data:`algorithms.choice.RULES` under its own name. A record with a ``response`` key is re-parsed from it (so old
  folders re-score with today's rules); ``robust`` needs the record's ``options`` (else the stored
  ``pred_robust``); a record without ``options`` is parsed with the benchmark's usual option count
  (:data:`DEFAULT_NUM_OPTIONS`, counted in ``n_options_assumed``); a record without ``response`` keeps its stored
  ``pred`` / ``pred_robust``.
* **Release aggregations** (``release`` of the benchmark's own rule): Video-MME: ``accuracy_answered`` = correct /
  questions whose extraction is not empty, overall and per duration / domain / task_type, as
  ``eval_your_results.py`` divides (thanku-all/parse_answer@afd52cfe:eval_your_results.py:eval_your_results);
  the release's ``by`` adds ``sub_category`` and ``by_duration`` repeats domain / sub-category / task type per
  duration, as it prints them;
  MLVU: ``m_avg``, the mean of the per-task accuracies (JUNJIE99/MLVU@fd060c10:
  evaluation/multiple_choice_evaluation/choice_bench.py:main, ``final_res['Avg']``); LongVideoBench:
  ``accuracy_fallback`` with the release's ``random.choice`` for an unparsed reply drawn from
  ``random.Random("lvb:<qid>")`` (the same number on every re-score) and ``expected_accuracy`` counting each
  unparsed reply as 1 / number of options (lmms-eval@75571cfe:lmms_eval/tasks/longvideobench/utils.py:
  longvideobench_aggregate_results, whose "Overall" is the pooled accuracy); WorldSense: the mean score over all
  questions, an empty extraction scoring 0 (VLMEvalKit@e8e78f05:vlmeval/dataset/worldsense.py:WorldSense.evaluate
  with ``exact_matching``), rated per domain, sub_category, task_domain, task_type, audio_class (each of a
  question's audio classes) and duration, overall and per duration (VLMEvalKit@23757c43:
  vlmeval/dataset/utils/worldsense.py:get_dimension_rating). Each release's headline name:
  :data:`.release.HEADLINES`.
* **Accuracy** (fractions in [0, 1]): ``accuracy = correct / n_scored`` with ``n_scored`` the records with an
  answer and no error (an unparseable answer, ``pred`` null, counts as wrong); ``accuracy_all = correct /
  (n_scored + n_errors + n_missing)`` also counts failed and missing questions as wrong.
* **Breakdowns** (over scored records): Video-MME by ``duration`` / ``domain`` / ``task_type``; MLVU by ``task``
  with ``m_avg`` = the mean of the per-task accuracies (MLVU's "M-Avg") and ``pooled`` = accuracy over
  all questions; LongVideoBench by ``duration_group`` / ``question_category``; WorldSense by ``domain`` /
  ``task_type``.
* **Uncertainty** (:mod:`algorithms.bootstrap`, percentile bootstrap, ``n_resamples`` 1000, seed 0, so every
  re-score gives the same numbers): each parser's ``accuracy_ci95`` / ``accuracy_all_ci95`` (``[low, high]``,
  fractions; ``accuracy_all``'s resample counts errors and missing questions as wrong), and ``differences``: per
  benchmark, every variant against the reference variant (``base``, else ``full``, else the groups without a
  variant, else the first; :func:`.scores.reference_variant`) at the same budget (``a`` the variant, ``b`` the
  reference), and the reference variant's budgets against each other (``a`` the larger budget): the paired
  difference of accuracy (``a`` minus ``b``) over the
  questions scored in both, with ``ci95`` and ``p_two_sided``. ``bootstrap`` records the settings. The table shows
  the interval's half-width (``±95``) and the official parser's differences below it.
* **Missing**: when the expected qids of a benchmark are known (from the annotation), ``n_missing`` counts those
  with no record (error records are not missing) and ``missing_qids`` lists the first 50.

Command: ``python -m callbacks.scoring <out_root> [--expected videomme=/data/videomme ...] [--rules lvb robust ...]
[--no-plots]`` prints
the table and writes ``<out_root>/scores.json`` and the PNG plots; :class:`ScoreOnPredictEnd` does the same at
the end of ``trainer.predict``.
``n_reused`` counts a group's records copied from ``base`` by the layout ablation (``reused: true``).
"""
from __future__ import annotations

from datamodules.features import atomic_write_bytes  # noqa: F401 - re-exported

from .callback import ScoreOnPredictEnd, log_to_wandb
from .command import main
from .console import RULE_DESCRIPTIONS, format_table
from .output import SCORES_FILE, compute_scores, save_scores, write_scores
from .plots import build_figures, plot_scores
from .release import (BENCHMARK_AGGREGATIONS, BREAKDOWNS, DEFAULT_NUM_OPTIONS, HEADLINES, headline,
                      lvb_fallback_choice)
from .scores import (COST_FIELDS, DURATION_KEY, MAX_LISTED_MISSING, PARSERS, cost_means, read_records,
                     reference_variant, score_records)
from .summary import format_p

__all__ = ["ScoreOnPredictEnd", "log_to_wandb", "main", "RULE_DESCRIPTIONS", "format_table", "SCORES_FILE",
           "compute_scores", "save_scores", "write_scores", "build_figures", "plot_scores", "BENCHMARK_AGGREGATIONS",
           "BREAKDOWNS", "DEFAULT_NUM_OPTIONS", "HEADLINES", "headline", "lvb_fallback_choice", "COST_FIELDS",
           "DURATION_KEY", "MAX_LISTED_MISSING", "PARSERS", "cost_means", "read_records", "reference_variant",
           "score_records", "format_p"]
