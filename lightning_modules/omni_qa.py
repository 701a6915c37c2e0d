"""OmniPruningQA: thin LightningModule around :class:`models.omni.qa.OmniQA` (issue 7 part 3).

``predict_step`` takes one video (all its questions, from :class:`datamodules.omni_qa.OmniQADataModule`), runs the
processors and towers once, prunes once per variant, and answers every (question, variant) still to do with one
prefill of the pruned prompt. One record per (question, variant): job ``full`` (no pruning) or
``<variant>_r<retention>`` (e.g. ``v3_r0.5``), written by :class:`callbacks.jsonl_writer.JsonlPredictionWriter` and
scored by :class:`callbacks.scoring.ScoreOnPredictEnd`.

Record fields: ``qid, video, benchmark, job, variant, retention, budget (None), answer, pred, pred_robust,
response, meta`` (the loader's meta + ``template``), kept tokens ``num_video_tokens, num_audio_tokens,
num_text_tokens, num_prefill_tokens`` and their unpruned ``*_full`` counts, ``num_audio_merged``,
``video_retention_reached`` / ``audio_retention_reached`` (kept / unpruned tokens: the retention the variant actually
reached, next to the nominal ``retention``; DyCoke's count differs from the nominal one),
``prefill_flops`` (:func:`models.omni.qa.prefill_flop_fields`, plus ``measured`` from ``FlopCounterMode`` when
``measure_flops``, else ``None``), ``prefill_time_s, peak_memory_bytes, peak_memory_kind, encode_time_s,
prune_time_s``, ``video_info`` and ``audio_info``; or ``error`` instead of the answer fields when the video could
not be read, CUDA ran out of memory or answering it raised an input-dependent error (the table of
:mod:`lightning_modules.budgeted_qa`; a programming error stops the run naming the video).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule

from algorithms.choice import RULES, parse, parse_robust
from algorithms.pruning import VARIANTS, retention_floor
from algorithms.errors import SettingError, check_dtype
from datamodules.benchmarks import Question, question_sha1
from datamodules.benchmarks.prompts import (OMNI_DEFAULT_TEMPLATE, chat_parts, check_template, pre_media_text,
                                            prompt_and_template)
from models.loading import check_attn_implementation
from models.omni import FULL, OmniQA, prefill_flop_fields

from .budgeted_qa import run_or_error_records, split_question_errors

log = logging.getLogger(__name__)


def job_name(variant: str, retention: float) -> str:
    """``full`` for the unpruned model, else ``<variant>_r<retention>`` (``v3_r0.5``)."""
    return FULL if variant == FULL else f"{variant}_r{retention:g}"


class OmniPruningQA(LightningModule):
    """WorldSense-style audio+video QA with the Qwen2.5-Omni thinker under token pruning.

    Args:
        model_path: local thinker checkpoint directory (see :class:`models.omni.qa.OmniQA`).
        variants: ``full`` and/or registered pruning variants (``baseline``, ``v1`` ... ``v6``).
        retention: kept fraction of each modality's tokens (both modalities).
        audio_retention: a different audio retention (``None``: ``retention``).
        max_new_tokens: greedy answer length (100: KD-TAO/OmniZip@9060291:eval/eval.py:evaluate_sample's
            ``max_new_tokens=100``, the configuration seed 003:7 follows).
        answer_rule: how the reply becomes a letter (``pred``, ``pred_rule``; :mod:`algorithms.choice`):
            ``omnizip`` (default): OmniZip's eval, the reply stripped, the first of A-F it starts with, else its first
            character; ``worldsense``: VLMEvalKit's WorldSense regex (the benchmark's harness); any other rule of
            :data:`algorithms.choice.RULES` (``SettingError`` otherwise). The scorer's official parser follows it.
        prompt_template: template name (``None``: ``omnizip_worldsense``, OmniZip's WorldSense evaluation, the
            configuration seed 003 follows, with its system turn; ``worldsense``: VLMEvalKit's WorldSense prompt with
            audio, its SYS text before the media; ``lmms_eval_worldsense``: lmms-eval's).
        dtype: model dtype: ``float32``, ``bfloat16`` or ``float16`` (else ``SettingError``, before anything is
            written).
        attn_implementation: ``sdpa`` or ``eager`` (eager for measured FLOPs on CPU), or ``flash_attention_2``
            (OmniZip's eval; needs the ``flash_attn`` package and a half-precision dtype, else a one-line
            ``SettingError``).
        measure_flops: count the prefill with ``FlopCounterMode`` (slower).
    """

    def __init__(self, model_path: str = "checkpoints/tiny-omni",
                 variants: list[str] = (FULL, "baseline", "v1", "v2", "v3", "v4", "v5", "v6"),
                 retention: float = 0.5, audio_retention: float | None = None, max_new_tokens: int = 100,
                 prompt_template: str | None = None, dtype: str = "float32", attn_implementation: str = "sdpa",
                 measure_flops: bool = False, answer_rule: str = "omnizip"):
        super().__init__()
        variants = list(variants)
        if not variants:
            raise SettingError("variants must not be empty")
        unknown = [v for v in variants if v != FULL and v not in VARIANTS]
        if unknown:
            raise SettingError(f"unknown variant(s) {unknown}; known: {[FULL, *VARIANTS]}")
        for r in (retention, audio_retention):
            if r is not None and not 0.0 < r <= 1.0:
                raise SettingError(f"retention must be in (0, 1], got {r}")
        r_a = retention if audio_retention is None else audio_retention
        for v in variants:
            if v == FULL:
                continue
            floor_v, floor_a = retention_floor(v)
            for what, r, floor in (("retention", retention, floor_v),
                                   ("audio_retention" if audio_retention is not None else "retention", r_a, floor_a)):
                if r < floor:
                    raise SettingError(f"{what}={r}: variant {v!r} keeps DyCoke TTM's token count, which is at "
                                       f"least {floor} of the tokens (drop {v!r} from variants or raise {what})")
        check_template(prompt_template)
        if answer_rule not in RULES or answer_rule == "robust":
            raise SettingError(f"answer_rule {answer_rule!r} is unknown; known: "
                               f"{[r for r in RULES if r != 'robust']} (omnizip: OmniZip's eval, the default)")
        check_dtype("model.init_args.dtype", dtype)   # before the writer's run.json, not at the model load
        check_attn_implementation("model.init_args.attn_implementation", attn_implementation, dtype)
        self.save_hyperparameters()
        self.variants = variants
        self.qa: OmniQA | None = None
        self.last_stage_seconds: dict[str, float] = {}  # read by callbacks.timing.StageTimer
        self.load_seconds = 0.0                         # model load (on_predict_start), read by StageTimer

    @property
    def retentions(self) -> float | tuple[float, float]:
        hp = self.hparams
        return hp.retention if hp.audio_retention is None else (hp.retention, hp.audio_retention)

    @property
    def jobs(self) -> dict[str, str]:
        """Job name -> variant."""
        return {job_name(v, self.hparams.retention): v for v in self.variants}

    def record_settings(self) -> dict:
        """Settings that determine a record (kept in the output folder's ``run.json``, which refuses a resumed run
        with other ones; variants may be added, since each has its own job). Raises ``FileNotFoundError`` for a
        missing ``model_path`` before the settings are compared."""
        hp = self.hparams
        path = Path(hp.model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model_path {hp.model_path}: no config.json (not a checkpoint directory)")
        return {"model_path": str(path.resolve()), "retention": hp.retention, "audio_retention": hp.audio_retention,
                "max_new_tokens": hp.max_new_tokens, "dtype": hp.dtype,
                # None meant VLMEvalKit's WorldSense prompt in folders written before; it now means OmniZip's
                "prompt_template": hp.prompt_template if hp.prompt_template is not None
                else f"default:{OMNI_DEFAULT_TEMPLATE}",
                "attn_implementation": hp.attn_implementation,
                # absent in folders written before the setting: they were parsed with VLMEvalKit's regex
                "answer_rule": hp.get("answer_rule", "omnizip")}

    def setup(self, stage: str) -> None:
        """Check the settings that depend on the device (the model itself loads in :meth:`on_predict_start`).

        Raises:
            SettingError: ``measure_flops`` on the CPU without ``attn_implementation=eager``.
        """
        hp = self.hparams
        trainer = getattr(self, "_trainer", None)
        device = trainer.strategy.root_device if trainer is not None else self.device
        if hp.measure_flops and hp.attn_implementation != "eager" and device.type == "cpu":
            # FlopCounterMode has no formula for the CPU SDPA kernels: the attention FLOPs would be left out
            raise SettingError("measure_flops on the CPU needs model.init_args.attn_implementation=eager (the CPU "
                               f"{hp.attn_implementation} attention is invisible to FlopCounterMode)")

    def on_predict_start(self) -> None:
        """Load the model here, as :class:`~lightning_modules.budgeted_qa.BudgetedQA` does: the DataLoader workers
        decode the first videos meanwhile, and ``callbacks.timing.StageTimer`` reports the load (``load_seconds``)
        inside the run's wall time."""
        self.load_model()

    def load_model(self) -> None:
        """Load the thinker from ``model_path`` onto this module's device (once); ``load_seconds``: the seconds it
        took (0 when it was already loaded, e.g. by an earlier ``predict`` call)."""
        self.load_seconds = 0.0
        if self.qa is None:
            hp = self.hparams
            t0 = time.perf_counter()
            self.qa = OmniQA(hp.model_path, dtype=hp.dtype, attn_implementation=hp.attn_implementation,
                             max_new_tokens=hp.max_new_tokens).to(self.device)
            self.load_seconds = time.perf_counter() - t0

    def on_predict_end(self) -> None:
        """Release the thinker at the end of predict, as :meth:`BudgetedQA.on_predict_end
        <lightning_modules.budgeted_qa.BudgetedQA.on_predict_end>` does: Lightning's strategy teardown, which runs
        next, would otherwise copy all its weights to the CPU. A later ``predict`` loads it again."""
        self.qa = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _base(self, item: dict, q: dict, job: str) -> dict:
        variant = self.jobs[job]
        return {"qid": q["qid"], "video": item["video_id"], "benchmark": item["benchmark"], "job": job,
                "variant": variant, "retention": 1.0 if variant == FULL else self.hparams.retention,
                "audio_retention": None if variant == FULL else self.hparams.audio_retention, "budget": None,
                "answer": q["answer"], "meta": q["meta"]}

    def error_records(self, item: dict, message: str) -> list[dict]:
        """One error record per (question, job) still to do on a video."""
        return [{**self._base(item, q, job), "error": message}
                for q in item["questions"] for job in item["jobs"].get(q["qid"], []) if job in self.jobs]

    def predict_step(self, item: dict, batch_idx: int = 0) -> list[dict]:
        if item.get("error"):
            log.warning("video %s: %s", item["video_id"], item["error"])
            return self.error_records(item, item["error"])
        item, bad = split_question_errors(item)   # a question the loader marked (WorldSense: 1 or > 10 options)
        out = [{**self._base(item, q, job), "error": q["error"]}
               for q in bad for job in item["jobs"].get(q["qid"], []) if job in self.jobs]
        if item["questions"]:
            out += run_or_error_records(item, lambda: self.answer_video(item),
                                        lambda msg: self.error_records(item, msg))
        return out

    def answer_video(self, item: dict) -> list[dict]:
        """Encode once, prune once per variant, answer every (question, job) still to do."""
        hp = self.hparams
        qa = self.qa
        clip = qa.encode(item["frames"], item["audio"], item["video_info"].get("frame_interval_s", 1.0))
        questions = [Question(**q) for q in item["questions"]]
        records, prune_s, answer_s = [], 0.0, 0.0
        for job, variant in self.jobs.items():
            todo = [q for q in questions if job in item["jobs"].get(q.qid, [])]
            if not todo:
                continue
            t0 = time.perf_counter()
            pruned = qa.prune(clip, variant, self.retentions)
            t_prune = time.perf_counter() - t0
            prune_s += t_prune
            for q in todo:
                text, template = prompt_and_template(q, hp.prompt_template or OMNI_DEFAULT_TEMPLATE)
                t1 = time.perf_counter()
                inputs = qa.build_inputs(clip, pruned, text, pre_media_text(template), chat_parts(template)[0])
                ans = qa.answer(inputs, measure_flops=hp.measure_flops)
                answer_s += time.perf_counter() - t1
                flops = prefill_flop_fields(inputs.num_prefill, inputs.num_video + inputs.num_audio, qa.shape)
                flops["measured"] = ans.measured_flops
                records.append({
                    **self._base(item, {"qid": q.qid, "answer": q.answer, "meta": q.meta}, job),
                    "pred": parse(ans.text, q.options, hp.answer_rule),
                    "pred_rule": hp.answer_rule,
                    "pred_robust": parse_robust(ans.text, q.options), "options": list(q.options),
                    "question_sha1": question_sha1(q.question), "response": ans.text, "meta": {**q.meta, "template": template},
                    "num_video_tokens": inputs.num_video, "num_audio_tokens": inputs.num_audio,
                    "num_text_tokens": inputs.num_text, "num_prefill_tokens": inputs.num_prefill,
                    "num_video_tokens_full": inputs.num_video_full, "num_audio_tokens_full": inputs.num_audio_full,
                    "num_prefill_tokens_full": int(inputs.input_ids.numel()),
                    "num_audio_merged": inputs.num_audio_merged,
                    # the retention actually reached (DyCoke's count is not the nominal one: 0.583 at 0.5 on 8 patches)
                    "video_retention_reached": inputs.num_video / max(inputs.num_video_full, 1),
                    "audio_retention_reached": inputs.num_audio / max(inputs.num_audio_full, 1),
                    "prefill_flops": flops, "prefill_time_s": ans.prefill_seconds,
                    "peak_memory_bytes": ans.peak_memory_bytes, "peak_memory_kind": ans.peak_memory_kind,
                    "attn_implementation": qa.attn_implementation,
                    "encode_time_s": clip.encode_seconds, "prune_time_s": t_prune,
                    "video_grid_thw": [int(x) for x in clip.video_grid_thw[0]],
                    "second_per_grid": clip.second_per_grid,
                    "video_info": {**item["video_info"], "n_frames_model": clip.num_frames},
                    "audio_info": item["audio_info"],
                })
        self.last_stage_seconds = {"encode": clip.encode_seconds, "prune": prune_s, "answer": answer_s}
        return records
