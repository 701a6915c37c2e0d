"""Issue 7 part 3: whole-clip omni QA with token pruning (tiny random thinker, real media, CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from algorithms.flops import get_shape, paper_prefill_flops, prefill_flops
from algorithms.pruning import VARIANTS, apply_variant, merge_tokens

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "predict" / "worldsense_pruning.yaml"
QUESTION = "Which option is right?\nA. one\nB. two\nC. three\nD. four\nThe best answer is:"


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory) -> Path:
    from models.tokenizer import build_qwen_tokenizer
    from models.omni.tiny import build_tiny_omni

    out = build_tiny_omni(tmp_path_factory.mktemp("tiny-omni"), seed=0)
    build_qwen_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    from datamodules.omni_qa import make_demo

    return make_demo(tmp_path_factory.mktemp("ws") / "worldsense")


@pytest.fixture(scope="module")
def qa(omni_dir):
    from models.omni.qa import OmniQA

    return OmniQA(omni_dir, attn_implementation="eager", max_new_tokens=4)


@pytest.fixture(scope="module")
def item(demo_root):
    from datamodules.omni_qa import OmniQADataset

    return OmniQADataset([]).load(str(demo_root / "videos" / "cockatoo.mp4"))


@pytest.fixture(scope="module")
def clip(qa, item):
    return qa.encode(item["frames"], item["audio"], item["video_info"]["frame_interval_s"])


def _direct(clip, variant, retention=0.5):
    """The variant's keep indices computed straight from the tower outputs (1 fps: one temporal patch per block)."""
    return apply_variant(variant, clip.video_tokens.float(), clip.audio_tokens.float(), clip.audio_attention,
                         retention, patches_per_block=1, audio_tokens_per_block=50)


def test_decode_audio_and_demo_items(demo_root, item):
    from datamodules.decode import DecodeError
    from datamodules.omni_qa import OmniQADataset, decode_audio

    # qwen_omni_utils' choice (the default): decord's 280 frames at 20 fps, 14 s at 1 fps -> 14 frames,
    # linspace(0, 279, 14) (step 21.46), sample_fps = 14 / 280 * 20 = 1.0
    assert item["frames"].shape[0] == 14 and item["video_info"]["sample_fps"] == 1.0
    assert item["video_info"]["frame_interval_s"] == 1.0 and item["video_info"]["frame_sampling"] == "omnizip"
    assert item["times_s"] == [k / 20 for k in (0, 21, 43, 64, 86, 107, 129, 150, 172, 193, 215, 236, 258, 279)]
    assert item["audio_info"]["has_audio"] and abs(item["audio_info"]["duration_s"] - 13.9) < 0.2
    assert item["audio"].dtype == np.float32  # the cockatoo's mp3 track is digital silence
    short = OmniQADataset([]).load(str(demo_root / "videos" / "realshort.mp4"))
    assert short["audio_info"]["has_audio"] and np.abs(short["audio"]).max() > 0.01
    # realshort: 36 frames at 30.02 fps (1.2 s) -> FPS_MIN_FRAMES = 4 frames, linspace(0, 35, 4) -> 0, 12, 23, 35
    assert short["frames"].shape[0] == 4 and short["audio_info"]["padded_s"] == 0.0
    assert short["video_info"]["nframes"] == 4 and short["video_info"]["sample_fps"] == round(4 / 36 * 30.020013342228154, 6)
    # seed 001's decode (ffmpeg_rate): realshort ends at 1.1992 s -> floor(1.1992 * 1 fps) = 1 frame
    rate = OmniQADataset([], frame_sampling="ffmpeg_rate").load(str(demo_root / "videos" / "realshort.mp4"))
    assert rate["frames"].shape[0] == 1 and rate["video_info"]["frame_sampling"] == "ffmpeg_rate"
    silent = OmniQADataset([]).load(str(demo_root / "videos" / "realshort_silent.mp4"))
    assert not silent["audio_info"]["has_audio"]
    assert len(silent["audio"]) == round(silent["video_info"]["duration_s"] * 16000) and not silent["audio"].any()
    with pytest.raises(DecodeError, match="not found"):
        decode_audio(demo_root / "videos" / "missing.mp4")
    cut = decode_audio(demo_root / "videos" / "cockatoo.mp4", max_s=2.0)
    assert cut.truncated and len(cut.samples) == 32000
    with pytest.raises(ValueError, match="multiple of 8 with ffmpeg_rate"):
        OmniQADataset([], max_frames=100, frame_sampling="ffmpeg_rate")
    assert OmniQADataset([], max_frames=100).max_frames == 100     # omnizip floors it to even, as the release


def test_keep_counts_equal_variant_keep_indices(qa, clip):
    t, n, _ = clip.video_tokens.shape
    assert (t, n) == (7, 15) and clip.audio_tokens.shape[0] == 347 and clip.second_per_grid == 2.0
    cfg = qa.config
    for name in VARIANTS:
        ref = _direct(clip, name)
        inputs = qa.build_inputs(clip, qa.prune(clip, name, 0.5), QUESTION)
        v_slots = torch.nonzero(inputs.input_ids == cfg.video_token_id).flatten()
        a_slots = torch.nonzero(inputs.input_ids == cfg.audio_token_id).flatten()
        assert torch.equal(torch.nonzero(inputs.keep[v_slots]).flatten(), ref.video_keep), name
        assert torch.equal(torch.nonzero(inputs.keep[a_slots]).flatten(), ref.audio_keep), name
        assert (inputs.num_video, inputs.num_audio) == (ref.num_video, ref.num_audio), name
        assert inputs.num_text == int(inputs.input_ids.numel()) - t * n - 347
        assert inputs.num_prefill == inputs.num_text + ref.num_video + ref.num_audio
        assert ref.num_video < t * n and ref.num_audio < 347, name
    full = qa.build_inputs(clip, qa.prune(clip, "full", 0.5), QUESTION)
    assert bool(full.keep.all()) and (full.num_video, full.num_audio) == (t * n, 347)


def test_kept_positions_are_unpruned_positions_gathered(qa, clip):
    cfg = qa.config
    t, n, _ = clip.video_tokens.shape
    hh, ww = (int(x) // 2 for x in clip.video_grid_thw[0, 1:])
    for name in ("v3", "v4"):
        pr = qa.prune(clip, name, 0.5)
        inputs = qa.build_inputs(clip, pr, QUESTION)
        ids = inputs.input_ids
        lib, _ = qa.thinker.model.get_rope_index(
            ids[None], None, clip.video_grid_thw, torch.ones(1, ids.numel(), dtype=torch.long), True,
            torch.tensor([clip.mel_length]), torch.tensor([clip.second_per_grid]))
        assert torch.equal(inputs.position_ids, lib[:, 0][:, inputs.keep])
        # by hand (TMRoPE, 1 fps = 50 positions per temporal patch): origin = audio_bos position + 1
        origin = int(lib[0, 0, int(torch.nonzero(ids == cfg.audio_start_token_id)[0])]) + 1
        p, y, x = torch.meshgrid(torch.arange(t), torch.arange(hh), torch.arange(ww), indexing="ij")
        video_pos = torch.stack([origin + 50 * p.flatten(), origin + y.flatten(), origin + x.flatten()])  # (3, T*N)
        audio_pos = (origin + torch.arange(347)).expand(3, -1)
        kept_ids = ids[inputs.keep]
        assert torch.equal(inputs.position_ids[:, kept_ids == cfg.video_token_id], video_pos[:, pr.video_keep])
        assert torch.equal(inputs.position_ids[:, kept_ids == cfg.audio_token_id], audio_pos[:, pr.audio_keep])
        # rows: video rows are the tower's, merged anchors are softmax(cos)-weighted sums
        emb = inputs.embeds[kept_ids == cfg.video_token_id]
        assert torch.equal(emb, clip.video_tokens.reshape(t * n, -1)[pr.video_keep])
        if name in ("v3", "v4"):
            a_emb = inputs.embeds[kept_ids == cfg.audio_token_id]
            merged = merge_tokens(clip.audio_tokens, pr.audio_merge)
            rows = torch.searchsorted(pr.audio_keep, pr.audio_merge.anchors)
            assert torch.allclose(a_emb[rows], merged, atol=1e-6)
            assert pr.audio_merge.anchors.numel() > 0


def test_tmrope_time_follows_the_sample_rate(qa, demo_root):
    """Qwen2.5-Omni's processor: ``video_second_per_grid = temporal_patch_size / fps`` with the ``fps`` qwen_omni_utils
    returns (``sample_fps``); ``get_rope_index``: ``t_index = (arange(grid_t) * second_per_grid * 25).long()``.
    realshort (4 frames, sample_fps = 4 / 36 * 30.02 = 3.3356): 2 patches of 2 / 3.3356 = 0.5996 s -> temporal
    positions 0 and floor(14.99) = 14 after the media origin; ``processor_fps=2.0`` (what OmniZip's eval gets from
    the processor's hard-coded 2.0): 1 s per patch -> 0 and 25."""
    from datamodules.omni_qa import OmniQADataset

    cfg = qa.config
    for processor_fps, spg, second in ((None, 2 / (4 / 36 * 30.020013342228154), 14), (2.0, 1.0, 25)):
        item = OmniQADataset([], processor_fps=processor_fps).load(str(demo_root / "videos" / "realshort.mp4"))
        clip = qa.encode(item["frames"], item["audio"], item["video_info"]["frame_interval_s"])
        assert clip.second_per_grid == spg and int(clip.video_grid_thw[0, 0]) == 2 and clip.num_frames == 4
        inputs = qa.build_inputs(clip, None, QUESTION)
        ids = inputs.input_ids
        origin = int(inputs.position_ids[0, int(torch.nonzero(ids == cfg.audio_start_token_id)[0])]) + 1
        t_pos = inputs.position_ids[0, ids == cfg.video_token_id]
        per_patch = clip.video_tokens.shape[1]
        assert t_pos.tolist() == [origin] * per_patch + [origin + second] * per_patch, processor_fps


def test_audio_attention_is_the_last_encoder_layers_own_weights(qa, item, clip, monkeypatch):
    """The dominant tokens' ranking (``clip.audio_attention``) from the attention weights the audio tower's last
    layer itself computes (transformers' eager kernel, one call per attention window): heads averaged, summed over
    queries, divided by the pre-pool length S, then averaged over each stride-2 output pair."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as m

    last = qa.thinker.model.audio_tower.layers[-1].self_attn
    assert qa.thinker.model.audio_tower.config._attn_implementation == "eager"
    windows = []
    kernel = m.eager_attention_forward

    def spy(module, *args, **kwargs):
        out = kernel(module, *args, **kwargs)
        if module is last:
            windows.append(out[1][0].float())  # (H, c, c) softmax weights of one window
        return out

    monkeypatch.setattr(m, "eager_attention_forward", spy)
    again = qa.encode(item["frames"], item["audio"], item["video_info"]["frame_interval_s"])
    assert len(windows) > 1 and torch.equal(again.audio_attention, clip.audio_attention)
    received = torch.cat([w.mean(0).sum(0) for w in windows])  # (S,)
    received = received / received.numel()
    pairs = received[: received.numel() // 2 * 2].reshape(-1, 2).mean(1)
    assert pairs.numel() == clip.audio_tokens.shape[0]
    assert torch.allclose(clip.audio_attention, pairs, atol=1e-6, rtol=1e-4)


def test_full_equals_plain_thinker_forward(qa, clip):
    from models.omni.qa import FULL

    inputs = qa.build_inputs(clip, qa.prune(clip, FULL, 0.5), QUESTION)
    ans = qa.answer(inputs, max_new_tokens=3)
    ids = inputs.input_ids
    extra = dict(clip.inputs, use_audio_in_video=True, video_second_per_grid=torch.tensor([clip.second_per_grid]))
    with torch.no_grad():
        ref = qa.thinker(input_ids=ids[None], attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
                         **extra).logits[0, -1]
    assert torch.allclose(ans.last_logits, ref, atol=1e-5, rtol=1e-5)
    # greedy continuation = plain forwards over the growing sequence (decode positions continue at max + 1)
    tokens = [int(ref.argmax())]
    for _ in range(len(ans.token_ids) - 1):
        seq = torch.cat([ids, torch.tensor(tokens)])
        with torch.no_grad():
            logits = qa.thinker(input_ids=seq[None], attention_mask=torch.ones(1, seq.numel(), dtype=torch.long),
                                **extra).logits[0, -1]
        tokens.append(int(logits.argmax()))
    assert ans.token_ids == tokens[: len(ans.token_ids)] and len(ans.token_ids) == 3


def test_flop_fields_and_measured_prefill(qa, clip):
    from models.omni.qa_inputs import prefill_flop_fields

    for name in ("full", "v4"):
        inputs = qa.build_inputs(clip, qa.prune(clip, name, 0.5), QUESTION)
        ans = qa.answer(inputs, max_new_tokens=1, measure_flops=True)
        n, n_mm = inputs.num_prefill, inputs.num_video + inputs.num_audio
        fields = prefill_flop_fields(n, n_mm, qa.shape)
        assert set(fields["paper"]) == {"qwen2.5-omni-3b", "qwen2.5-omni-7b"}
        assert fields["paper"]["qwen2.5-omni-7b"] == paper_prefill_flops(get_shape("qwen2.5-omni-7b"), n_mm)
        assert fields["accurate"]["qwen2.5-omni-3b"] == prefill_flops(get_shape("qwen2.5-omni-3b"), n, 1)
        expected = fields["accurate"]["model"]
        assert expected == prefill_flops(qa.shape, n, 1)
        assert ans.measured_flops and abs(ans.measured_flops - expected) / ans.measured_flops < 0.01, name
        assert ans.prefill_seconds > 0 and ans.peak_memory_bytes > 0


def test_yaml_instantiates(tmp_path):
    import yaml

    import evaluate
    from datamodules.omni_qa import OmniQADataModule
    from lightning_modules.omni_qa import OmniPruningQA

    assert CONFIG.read_text().splitlines()[0] == f"# python evaluate.py predict --config {CONFIG.relative_to(REPO)}"
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg.pop("return_predictions") is False  # a predict-subcommand key; run=False has no subcommand
    plain = tmp_path / CONFIG.name
    plain.write_text(yaml.safe_dump(cfg))
    cli = evaluate.cli_main([f"--config={plain}"], run=False)
    assert isinstance(cli.model, OmniPruningQA) and isinstance(cli.datamodule, OmniQADataModule)
    assert cli.model.variants == ["full", *VARIANTS] and cli.model.hparams.retention == 0.5
    assert list(cli.model.jobs)[:3] == ["full", "baseline_r0.5", "v1_r0.5"]
    assert cli.datamodule.loader_kwargs == {} and cli.datamodule.max_frames == 128 and cli.datamodule.fps == 1.0
    assert cli.datamodule.frame_sampling == "omnizip" and cli.datamodule.processor_fps == 2.0


def test_predict_job_records_and_scores(omni_dir, demo_root, tmp_path, qa, clip):
    import yaml

    import evaluate
    from algorithms.choice import parse_omnizip
    from callbacks.jsonl_writer import read_records

    out = tmp_path / "out"
    over = {"trainer": {"enable_progress_bar": False, "callbacks": [
                {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}},
                {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": False}}]},
            "model": {"init_args": {"model_path": str(omni_dir), "variants": ["full", "baseline", "v4"],
                                    "max_new_tokens": 4}},
            "data": {"init_args": {"root": str(demo_root), "num_workers": 0}}}
    cfg = tmp_path / "over.yaml"
    cfg.write_text(yaml.safe_dump(over))
    evaluate.cli_main(["predict", f"--config={CONFIG}", f"--config={cfg}"])
    recs = read_records(out)
    assert len(recs) == 4 * 3 and not any(r.get("error") for r in recs)
    assert {r["job"] for r in recs} == {"full", "baseline_r0.5", "v4_r0.5"}
    for r in recs:
        for key in ("num_video_tokens", "num_audio_tokens", "num_text_tokens", "prefill_time_s",
                    "peak_memory_bytes", "pred", "pred_robust", "response"):
            assert key in r, key
        assert set(r["prefill_flops"]) == {"paper", "accurate", "no_attention", "measured"} and r["prefill_flops"]["measured"] is None
        assert r["prefill_flops"]["accurate"]["qwen2.5-omni-7b"] == prefill_flops(
            get_shape("qwen2.5-omni-7b"), r["num_prefill_tokens"], 1)
        assert r["meta"]["template"] == "omnizip_worldsense"   # the omni default: OmniZip's WorldSense eval
        # and its answer rule (OmniZip@9060291 eval.py: strip, startswith(A-F), else the first character)
        assert r["pred_rule"] == "omnizip" and r["pred"] == parse_omnizip(r["response"])
    by = {(r["qid"], r["variant"]): r for r in recs}
    for variant in ("baseline", "v4"):  # same decode, same towers: the counts of the direct computation
        ref = _direct(clip, variant)
        r = by[("cockatoo_task0", variant)]
        assert (r["num_video_tokens"], r["num_audio_tokens"]) == (ref.num_video, ref.num_audio)
        assert r["video_retention_reached"] == ref.num_video / r["num_video_tokens_full"]
        assert r["audio_retention_reached"] == ref.num_audio / r["num_audio_tokens_full"]
    # DyCoke at nominal 0.5 on 7 patches of 15 (K = 2/3, k = 5): 3 pairs * 20 - 1 window * 10 = 50 of 105
    assert by[("cockatoo_task0", "baseline")]["video_retention_reached"] == 50 / 105
    assert by[("cockatoo_task0", "full")]["num_video_tokens"] == 105
    assert by[("realshort_silent_task0", "full")]["audio_info"]["has_audio"] is False
    assert by[("realshort_task0", "full")]["audio_info"]["has_audio"] is True
    # the sampling is in every record: realshort gets qwen_omni_utils' 4 frames, 2 temporal patches of 1 s each at
    # the default processor_fps 2.0 (the eval's processor: 2 / 2.0)
    short = by[("realshort_task0", "full")]
    assert {k: short["video_info"][k] for k in ("frame_sampling", "nframes", "total_frames", "n_frames_model")} == {
        "frame_sampling": "omnizip", "nframes": 4, "total_frames": 36, "n_frames_model": 4}
    assert short["video_info"]["sample_fps"] == round(4 / 36 * 30.020013342228154, 6)
    assert short["second_per_grid"] == 1.0 and short["video_grid_thw"][0] == 2
    scores = json.loads((out / "scores.json").read_text())
    assert {g["job"] for g in scores["groups"]} == {"full", "baseline_r0.5", "v4_r0.5"}
    assert all(g["n_scored"] == 4 for g in scores["groups"])
    assert all(g["parsers"]["official"]["rule"] == "omnizip" for g in scores["groups"])   # the job's own rule
    # the folder keeps its settings: a resumed run with another frame rate or answer length is refused before any
    # video is decoded (it would otherwise skip every question and score the old answers)
    from callbacks.jsonl_writer import OutputSettingsError

    settings = json.loads((out / "run.json").read_text())
    assert {k: settings[k] for k in ("frame_sampling", "fps", "max_frames", "processor_fps", "max_audio_s",
                                     "retention", "audio_retention", "max_new_tokens", "prompt_template",
                                     "dtype")} == {
        "frame_sampling": "omnizip", "fps": 1.0, "max_frames": 128, "processor_fps": 2.0, "max_audio_s": None,
        "retention": 0.5, "audio_retention": None, "max_new_tokens": 4,
        "prompt_template": "default:omnizip_worldsense", "dtype": "float32"}
    assert settings["model_path"] == str(omni_dir.resolve())
    before = sorted((p, p.stat().st_size) for p in out.glob("*/*/*.jsonl"))
    for extra, field in (("--data.init_args.fps=0.5", "fps: 1.0 there, 0.5 now"),
                         ("--data.init_args.frame_sampling=ffmpeg_rate",
                          "frame_sampling: 'omnizip' there, 'ffmpeg_rate' now"),
                         ("--data.init_args.processor_fps=null", "processor_fps: 2.0 there, None now"),
                         ("--model.init_args.max_new_tokens=2", "max_new_tokens: 4 there, 2 now")):
        with pytest.raises(OutputSettingsError, match=f"holds records made with other settings \\({field}\\)"):
            evaluate.cli_main(["predict", f"--config={CONFIG}", f"--config={cfg}", extra])
    assert sorted((p, p.stat().st_size) for p in out.glob("*/*/*.jsonl")) == before


def _omni_predict(omni_dir, demo_root, out, tmp_path, variants, name):
    """``evaluate.py predict`` of the pruning job in-process (StageTimer + the writer, 2 new tokens); the module."""
    import yaml

    import evaluate

    over = {"trainer": {"enable_progress_bar": False, "callbacks": [
                {"class_path": "callbacks.timing.StageTimer"},
                {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}}]},
            "model": {"init_args": {"model_path": str(omni_dir), "variants": variants, "max_new_tokens": 2}},
            "data": {"init_args": {"root": str(demo_root), "num_workers": 0}}}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(over))
    return evaluate.cli_main(["predict", f"--config={CONFIG}", f"--config={cfg}"]).model


@pytest.fixture(scope="module")
def first_pruning_run(omni_dir, demo_root, tmp_path_factory):
    """One fresh run of the pruning job (``full`` only), shared by the two tests below: (its output folder, its
    module, what it printed)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("pruning_first")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module = _omni_predict(omni_dir, demo_root, tmp / "out", tmp, ["full"], "first")
    return tmp / "out", module, printed.getvalue()


def test_the_pruning_job_reports_its_model_load(first_pruning_run):
    """The job's timing holds the real model load: it loads at predict start, like the VideoLLaMA3 job (it read
    0.00 s when the model loaded in ``setup``, outside the timer's view)."""
    out, module, _ = first_pruning_run
    timing = json.loads((out / "timing_rank0.json").read_text())
    assert module.load_seconds > 0 and timing["stages_s"]["load"] == round(module.load_seconds, 4)
    t = timing["timeline_s"]
    assert t["model_loaded"] - t["predict_start"] >= module.load_seconds - 0.01


def test_a_resumed_pruning_job_says_how_much_is_written(first_pruning_run, omni_dir, demo_root, tmp_path, capsys):
    """As the QA job: ``N of M (job, question) records already written`` when resuming, nothing on a fresh run."""
    import shutil

    from callbacks.jsonl_writer import read_records

    first_out, _, printed = first_pruning_run
    assert "already written" not in printed and "[rank 0] 3 videos in " in printed   # (the timer's line: caught)
    out = Path(shutil.copytree(first_out, tmp_path / "out"))   # the fresh run's folder, resumed here
    assert len(read_records(out)) == 4                         # 4 questions x full
    _omni_predict(omni_dir, demo_root, out, tmp_path, ["full", "baseline"], "second")
    assert ("[rank 0] worldsense: 4 of 8 (job, question) records already written; 3 videos left to run, 3 on this "
            "rank") in capsys.readouterr().out
    assert len(read_records(out)) == 8
    _omni_predict(omni_dir, demo_root, out, tmp_path, ["full", "baseline"], "third")
    assert "[rank 0] worldsense: 8 of 8 (job, question) records already written: nothing to run" in \
        capsys.readouterr().out


def test_pruning_settings_are_checked_at_construction(omni_dir):
    from algorithms.errors import SettingError
    from algorithms.pruning import retention_floor
    from datamodules.omni_qa import OmniQADataModule
    from lightning_modules.omni_qa import OmniPruningQA

    # DyCoke's count (baseline and V1 video, DyCoke audio) is >= 0.25; the audio selections reach any ratio
    assert retention_floor("baseline") == (0.25, 0.25) and retention_floor("v1") == (0.25, 0.25)
    assert retention_floor("v2") == (0.25, 0.0) and retention_floor("v4") == (0.25, 0.0)
    with pytest.raises(SettingError, match=r"^retention=0.1: variant 'v4' keeps DyCoke TTM's token count"):
        OmniPruningQA(str(omni_dir), variants=["full", "v4", "baseline"], retention=0.1)
    with pytest.raises(SettingError, match=r"^audio_retention=0.2: variant 'v1' keeps DyCoke TTM's token count"):
        OmniPruningQA(str(omni_dir), variants=["v1"], retention=0.3, audio_retention=0.2)
    assert OmniPruningQA(str(omni_dir), variants=["full", "v4"], retention=0.3, audio_retention=0.1).variants == [
        "full", "v4"]
    with pytest.raises(SettingError, match="prompt_template 'ws' is unknown"):
        OmniPruningQA(str(omni_dir), prompt_template="ws")
    for kwargs, msg in (({"fps": 0}, r"data.fps=0: expected frames per second in \(0, 30\]"),
                        ({"max_frames": 12, "frame_sampling": "ffmpeg_rate"},
                         "data.max_frames=12: expected a multiple of 8 with data.frame_sampling=ffmpeg_rate"),
                        ({"max_frames": 4, "frame_sampling": "ffmpeg_rate"},
                         "data.max_frames=4: expected an integer >= 8"),
                        ({"max_frames": 1}, "data.max_frames=1: expected an integer >= 2"),
                        ({"frame_sampling": "uniform"},
                         "data.frame_sampling='uniform': expected one of omnizip, ffmpeg_rate"),
                        ({"processor_fps": 0}, "data.processor_fps=0: expected frames per second > 0"),
                        ({"max_audio_s": 0}, "data.max_audio_s=0: expected seconds > 0")):
        with pytest.raises(SettingError, match=msg):
            OmniQADataModule(**kwargs)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        OmniPruningQA("/nonexistent/omni").record_settings()


def test_measured_flops_on_cpu_need_eager_attention(omni_dir):
    """FlopCounterMode sees no FLOPs in the CPU SDPA kernel, so a measured count with sdpa on the CPU would leave
    the attention out: refused at setup, naming the setting."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from algorithms.errors import SettingError
    from lightning_modules.omni_qa import OmniPruningQA

    q = torch.randn(1, 2, 16, 8)
    with FlopCounterMode(display=False) as fc:
        F.scaled_dot_product_attention(q, q, q)
    assert fc.get_total_flops() == 0           # the reason for the check (if torch learns it, drop the check)
    with pytest.raises(SettingError, match="measure_flops on the CPU needs model.init_args.attn_implementation=eager"):
        OmniPruningQA(str(omni_dir), measure_flops=True).setup("predict")
    module = OmniPruningQA(str(omni_dir), measure_flops=True, attn_implementation="eager", variants=["full"])
    module.setup("predict")
    assert module.qa is None                    # loaded at predict start (its seconds are the run's load stage)
    module.on_predict_start()
    assert module.qa is not None and module.load_seconds > 0
    module.on_predict_start()                   # loaded once
    assert module.load_seconds == 0.0
    module.on_predict_end()                     # released: Lightning's teardown finds nothing to copy to the CPU
    assert module.qa is None and list(module.parameters()) == []
    module.on_predict_start()                   # a later predict loads it again
    assert module.qa is not None and module.load_seconds > 0


def test_worldsense_prompt_puts_vlmevalkits_sys_text_before_the_media(qa, clip):
    """VLMEvalKit@e8e78f05 WorldSense.build_prompt: [SYS, video, audio, FRAMES_TMPL_AUDIO, 'Question: ...\\nAnswer: ']
    in one user turn, written out by hand around the media placeholders."""
    from datamodules.benchmarks import Question
    from datamodules.benchmarks.prompts import prompt_and_template, pre_media_text

    q = Question(qid="q", video_id="v", video_path="/v.mp4", question="Q?", options=["a", "b", "c", "d"],
                 answer="A", meta={"benchmark": "worldsense"})
    text, name = prompt_and_template(q)
    sys_text = ("Carefully watch this video and pay attention to every detail. Based on your observations, select "
                "the best option that accurately addresses the question.")
    assert name == "worldsense" and pre_media_text(name) == sys_text
    assert text == ("\nThese are the frames of a video and the corresponding audio. Select the best answer to the "
                    "following multiple-choice question based on the video. Respond with only the letter "
                    "(A, B, C, or D) of the correct option.\nQuestion: Q?\nA. a\nB. b\nC. c\nD. d\nAnswer: ")
    inputs = qa.build_inputs(clip, None, text, pre_media_text(name))
    plain = qa.build_inputs(clip, None, text)
    tok = qa.tokenizer
    head = tok(f"<|im_start|>system\n{qa.system_prompt}<|im_end|>\n<|im_start|>user\n{sys_text}",
               add_special_tokens=False)["input_ids"]
    ids = inputs.input_ids.tolist()
    assert ids[:len(head)] == head
    vbos = qa.config.vision_start_token_id
    rest = plain.input_ids.tolist()
    assert ids[len(head)] == vbos and ids[len(head):] == rest[rest.index(vbos):]   # media and question unchanged
    assert inputs.num_video == plain.num_video and inputs.num_audio == plain.num_audio


def test_omnizip_worldsense_prompt_and_system_turn(qa, clip):
    """KD-TAO/OmniZip@9060291 eval/eval.py evaluate_sample (the configuration seed 003 follows): its own system turn,
    the video, then f"{question}\\nOptions:\\n{candidates_text}\\nAnswer with the option's letter from the given
    choices directly." with the candidates verbatim."""
    from datamodules.benchmarks import Question
    from datamodules.benchmarks.prompts import OMNI_DEFAULT_TEMPLATE, chat_parts, pre_media_text, prompt_and_template

    q = Question(qid="q", video_id="v", video_path="/v.mp4", question="Q?", options=["a", "b", "c", "d"],
                 answer="A", meta={"benchmark": "worldsense"}, option_lines=["A. a", "B. b", "C. c", "D.d"])
    text, name = prompt_and_template(q, OMNI_DEFAULT_TEMPLATE)
    assert name == "omnizip_worldsense" and pre_media_text(name) == ""
    assert text == "Q?\nOptions:\nA. a\nB. b\nC. c\nD.d\nAnswer with the option's letter from the given choices directly."
    system = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory "
              "and visual inputs, as well as generating text and speech. Please analyze the video carefully and select "
              "the most appropriate answer from the given options.")
    assert chat_parts(name)[0] == system
    inputs = qa.build_inputs(clip, None, text, "", system)
    plain = qa.build_inputs(clip, None, text)
    head = qa.tokenizer(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n",
                        add_special_tokens=False)["input_ids"]
    ids, rest = inputs.input_ids.tolist(), plain.input_ids.tolist()
    vbos = qa.config.vision_start_token_id
    assert ids[:len(head)] == head and ids[len(head):] == rest[rest.index(vbos):]
