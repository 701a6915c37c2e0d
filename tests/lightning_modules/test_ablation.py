"""Layout-ablation predict job (issue 4): one decode and one encode per size per video, reuse, budgets, config."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import MEDIA, REPO, run_predict

# cockatoo (14 frames, 16:9) is capped by rho32 / rho128 / qtf2 at 128 and low64 at 256; realshort (1 frame) is
# short: every coverage variant keeps the baseline layout there (seed 000: eff = BASE), and its raw plan makes the
# swaps and hivar the baseline too.
JOBS = "base:128:1024,rho32:128,rho128:128,qtf2:128,low64:256,sel_resize:128,sel_merge:1024,mean_merge:128,hivar:1024"
N_JOBS = 10
N_QUESTIONS = 7
PLAIN_ONLY = {"variant", "job"}
NEW_TOKENS = 2  # short answers keep the suite fast (decode steps dominate on CPU); the same for every run compared


def _cfg(model_dir, bench_root, out_dir, model: dict) -> Path:
    import yaml

    cfg = {
        "trainer": {"enable_progress_bar": False, "callbacks": [
            {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out_dir)}}]},
        "model": model,
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(bench_root), "loader_kwargs": {}, "num_workers": 0}},
    }
    path = Path(out_dir).parent / f"{Path(out_dir).name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_ablation(model_dir, bench_root, out_dir, jobs=JOBS, no_reuse=False, **init_args):
    """In-process ``evaluate.py predict`` of the ablation job; returns (records, module, decode calls per file)."""
    import datamodules.video_items as vqa
    import evaluate
    from callbacks.jsonl_writer import read_records

    model = {"class_path": "lightning_modules.layout_ablation.LayoutAblationQA",
             "init_args": {"model_path": str(model_dir), "jobs": jobs, "no_reuse": no_reuse,
                           "max_new_tokens": NEW_TOKENS, **init_args}}
    decodes: dict[str, int] = {}
    real = vqa.decode_video

    def counting(path, *a, **k):
        decodes[Path(path).stem] = decodes.get(Path(path).stem, 0) + 1
        return real(path, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vqa, "decode_video", counting)
        cli = evaluate.cli_main(["predict", f"--config={_cfg(model_dir, bench_root, out_dir, model)}"])
    return read_records(out_dir), cli.model, decodes


@pytest.fixture(scope="module")
def runs(tiny_vl3_dir, tmp_path_factory):
    import tests.conftest as c

    tmp = tmp_path_factory.mktemp("ablate")
    root = tmp / "bench"
    (root / "videos").mkdir(parents=True)
    (root / "videomme").mkdir()
    shutil.copy(c.DEMO_PARQUET, root / "videomme")
    for f in MEDIA.glob("*.mp4"):
        shutil.copy(f, root / "videos" / f.name)
    plain = run_predict(tiny_vl3_dir, root, tmp / "plain", budgets=(128, 1024),
                        model_args={"max_new_tokens": NEW_TOKENS})
    no_reuse = run_ablation(tiny_vl3_dir, root, tmp / "no_reuse", no_reuse=True)
    reuse = run_ablation(tiny_vl3_dir, root, tmp / "reuse")
    return {"root": root, "tmp": tmp, "plain": plain, "no_reuse": no_reuse, "reuse": reuse}


def _by_key(recs):
    return {(r["job"], r["qid"]): r for r in recs}


def test_base_without_reuse_is_identical_to_plain_predict(runs):
    plain = _by_key(runs["plain"])
    recs, _, _ = runs["no_reuse"]
    base = [r for r in recs if r["variant"] == "base"]
    assert len(base) == len(plain) == 2 * N_QUESTIONS
    assert {r["mode"] for r in base} == {"raw", "hybrid", "forced8"}
    for r in base:
        p = plain[(f"b{r['budget']}", r["qid"])]
        assert r["job"] == f"base_b{r['budget']}" and p["variant"] is None
        assert {k: r[k] for k in p if k not in PLAIN_ONLY} == {k: v for k, v in p.items() if k not in PLAIN_ONLY}
        assert r["reused"] is False and r["same_as_base"] is True and r["capped"] is False


def test_one_decode_and_at_most_one_encode_per_size(runs):
    for name in ("no_reuse", "reuse"):
        _, module, decodes = runs[name]
        assert decodes == {"cockatoo": 1, "realshort": 1}
        assert set(module.video_stats) == {"cockatoo", "realshort"}
        for video, st in module.video_stats.items():
            grids = [g for g, _ in st["encode_calls"]]
            assert st["n_items"] == 1 and len(grids) == len(set(grids)), (video, st["encode_calls"])
            assert st["n_jobs"] == N_JOBS
    st = runs["reuse"][1].video_stats["cockatoo"]
    # cockatoo 720 x 1280, 14 frames: B = 128 -> cap min(256, 1024 // 14) = 73 -> (6, 11); B = 256 (base, the
    # reference of low64@256) -> cap 2048 // 14 = 146 -> (9, 16); B = 1024 and every capped job (<= 4 frames) -> cap
    # 256 -> (12, 21)
    assert sorted(g for g, _ in st["encode_calls"]) == [(6, 11), (9, 16), (12, 21)]
    # seed 000 build: the re-encodes, each from the job's encode grid to raw_frame_grid(hh, ww, 64):
    # low64@256 (capped, 4 frames at (12, 21), raw at (6, 10)); sel_resize@128 (2 middle frames, (6, 11) -> (5, 10))
    assert sorted(st["reencode_calls"]) == [((6, 11), (5, 10), 2), ((12, 21), (6, 10), 4)]
    assert sorted(runs["no_reuse"][1].video_stats["cockatoo"]["reencode_calls"]) == sorted(st["reencode_calls"])


def test_reuse_where_inputs_equal_and_no_reuse_runs_everything(runs):
    nr, nr_mod, _ = runs["no_reuse"]
    ru, ru_mod, _ = runs["reuse"]
    assert len(nr) == len(ru) == N_JOBS * N_QUESTIONS
    assert not any(r["reused"] for r in nr)
    nr_k, ru_k = _by_key(nr), _by_key(ru)
    assert nr_k.keys() == ru_k.keys()
    for key, r in ru_k.items():
        n = nr_k[key]
        assert r["same_as_base"] == n["same_as_base"]
        assert r["reused"] == (r["same_as_base"] and r["variant"] != "base")
        # a copied record is what running the variant gives: same answer, same stats (a copy carries the
        # baseline's group_substitute / group_grid, as seed 000 copies base's record: a swap reused on a plan
        # without compressed groups)
        drop = {"reused", "group_substitute", "group_grid"} if r["reused"] else {"reused"}
        if r["reused"]:
            assert n["n_compressed"] == 0 or n["group_substitute"] == "qbase"
        assert {k: v for k, v in r.items() if k not in drop} == {k: v for k, v in n.items() if k not in drop}, key
    reused = {(r["job"], r["video"]) for r in ru if r["reused"]}
    # short video under a rho cap keeps the baseline layout; the capped long one does not
    assert ("rho32_b128", "realshort") in reused and ("rho32_b128", "cockatoo") not in reused
    assert ("low64_b256", "realshort") in reused and ("low64_b256", "cockatoo") not in reused
    assert ("qtf2_b128", "realshort") in reused and ("qtf2_b128", "cockatoo") not in reused
    # seed reuse: a swap equals the baseline only where the plan compresses nothing (realshort: one raw frame)
    for j in ("sel_resize_b128", "sel_merge_b1024", "mean_merge_b128", "hivar_b1024"):
        assert (j, "realshort") in reused
    for j in ("sel_resize_b128", "mean_merge_b128"):   # cockatoo at 128: forced8, both groups compressed
        assert (j, "cockatoo") not in reused
    nr_prefix = sum(s["n_prefixes"] for s in nr_mod.video_stats.values())
    ru_prefix = sum(s["n_prefixes"] for s in ru_mod.video_stats.values())
    assert nr_prefix == 2 * N_JOBS  # every (video, job) runs the LLM
    assert ru_prefix < nr_prefix
    assert sum(s["n_reused_jobs"] for s in ru_mod.video_stats.values()) == len(reused)


def test_variant_records_respect_budgets(runs):
    recs, _, _ = runs["reuse"]
    out = runs["tmp"] / "reuse"
    assert {p.name for p in out.iterdir() if p.is_dir()} == {
        "base_b128", "base_b1024", "rho32_b128", "rho128_b128", "qtf2_b128", "low64_b256",
        "sel_resize_b128", "sel_merge_b1024", "mean_merge_b128", "hivar_b1024"}  # no base_b256 though reused
    for r in recs:
        assert r["job"] == f"{r['variant']}_b{r['budget']}"
        assert r["vision_tokens"] <= r["budget"]
        k = 64 if r["group_substitute"] == "qbase" else r["group_grid"][0] * r["group_grid"][1]
        assert r["vision_tokens"] == r["n_raw_frames"] * r["raw_hw"] + k * r["n_compressed"]
        assert r["raw_hw"] == r["raw_grid"][0] * r["raw_grid"][1]
        assert sum(r["seg_lens"]) == r["video_info"]["n_frames"] == r["n_frames_kept"]
        if r["capped"]:
            assert r["video_info"]["capped"]
    by = {(r["job"], r["video"]): r for r in recs}
    assert by[("rho128_b128", "cockatoo")]["n_frames_kept"] == 1 and by[("rho128_b128", "cockatoo")]["capped"]
    low = by[("low64_b256", "cockatoo")]
    assert low["capped"] and low["mode"] == "raw" and low["raw_hw"] <= 64 and low["n_frames_kept"] == 4
    qtf = by[("qtf2_b128", "cockatoo")]
    assert qtf["capped"] and qtf["mode"] == "qbase" and qtf["n_frames_kept"] == 3 and qtf["n_compressed"] == 2
    # seed 000 features(): a capped job's encode grid is that of its own frame count (4 frames at B = 128:
    # cap min(256, 1024 // 4) = 256 -> 12 x 21), not the budget's (14 frames: 6 x 11)
    assert by[("rho32_b128", "cockatoo")]["hw"] == 252 and by[("base_b128", "cockatoo")]["hw"] == 66
    assert by[("rho32_b128", "cockatoo")]["n_frames_kept"] == 4
    sw = by[("sel_resize_b128", "cockatoo")]
    # seed 000:1161 small = raw_frame_grid(6, 11, 64): 66 > 64 cells, beta = sqrt(66 / 64) -> (5, 10), 50 rows
    # (the native frame at 64 rows would be 6 x 10); forced8: 2 groups, no raw frame
    assert sw["n_compressed"] == 2 and sw["group_grid"] == [5, 10] and sw["vision_tokens"] == 100
    mm = by[("mean_merge_b128", "cockatoo")]
    assert mm["group_grid"] == sw["group_grid"] and mm["vision_tokens"] == 100


def test_resume_recomputes_an_unrequested_baseline(runs, tiny_vl3_dir):
    out = runs["tmp"] / "reuse"
    recs = _by_key(runs["reuse"][0])
    f = out / "low64_b256" / "videomme" / "rank0.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    kept = [l for l in lines if json.loads(l)["video"] != "realshort"]
    f.write_text("".join(kept))
    again, module, decodes = run_ablation(tiny_vl3_dir, runs["root"], out)
    assert decodes == {"realshort": 1}  # only the video with something left to do is decoded
    st = module.video_stats["realshort"]
    assert st["n_jobs"] == 1 and st["n_reused_jobs"] == 1 and st["n_prefixes"] == 1  # the baseline, run again
    assert _by_key(again) == recs and not (out / "base_b256").exists()


def test_no_reuse_is_recorded_and_a_folder_resumes_only_with_its_own_value(runs, tiny_vl3_dir):
    """``no_reuse`` is a run.json setting: ``no_reuse: true`` on a folder written with reuse (``reused: true``
    records) is refused before anything is written, naming the setting, the folder and both values, instead of
    skipping every written qid; a folder written before the setting was recorded counts as written with reuse."""
    from callbacks.jsonl_writer import OutputSettingsError

    assert json.loads((runs["tmp"] / "reuse" / "run.json").read_text())["no_reuse"] is False
    assert json.loads((runs["tmp"] / "no_reuse" / "run.json").read_text())["no_reuse"] is True
    old = runs["tmp"] / "reuse_old"                       # run.json of a folder written before no_reuse was kept
    shutil.copytree(runs["tmp"] / "reuse", old)
    settings = json.loads((old / "run.json").read_text())
    del settings["no_reuse"]
    (old / "run.json").write_text(json.dumps(settings))
    for folder, there, now in ((runs["tmp"] / "reuse", False, True), (old, False, True),
                               (runs["tmp"] / "no_reuse", True, False)):
        before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}
        with pytest.raises(OutputSettingsError) as e:
            run_ablation(tiny_vl3_dir, runs["root"], folder, no_reuse=now)
        assert str(e.value).startswith(f"{folder} holds records made with other settings (no_reuse: {there} there, "
                                       f"{now} now)")
        assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")} == before


# ----------------------------------------------------------------------------------------- baseline_run

# the jobs of JOBS at the plain run's budgets (128, 1024)
RUN_JOBS = "base:128:1024,rho32:128,rho128:128,qtf2:128,sel_resize:128,sel_merge:1024,mean_merge:128,hivar:1024"


def test_baseline_run_records_are_copied_where_inputs_equal(runs, tiny_vl3_dir):
    """Seed 000 --baseline_run: the baseline's records come from the plain predict folder (decoded for 1024, the
    ablation's decode_budget here: the two short clips decode every 1 fps frame either way, so the in-run reuse
    run is the reference); base itself is copied too (seed ``reuse = eff is BASE``), the LLM runs only the rest."""
    out = runs["tmp"] / "from_plain"
    recs, module, _ = run_ablation(tiny_vl3_dir, runs["root"], out, jobs=RUN_JOBS, decode_budget=1024,
                                   baseline_run=str(runs["tmp"] / "plain"))
    ref = _by_key(runs["reuse"][0])
    plain = _by_key(runs["plain"])
    got = _by_key(recs)
    assert len(got) == 9 * N_QUESTIONS
    for (job, qid), r in got.items():
        e = dict(ref[(job, qid)])
        if e["variant"] == "base":
            e["reused"] = True      # copied from the baseline run, as the seed copies base
        assert r == e, (job, qid)
        if r["reused"]:             # the plain predict record itself, with this run's layout fields
            p = plain[(f"b{r['budget']}", qid)]
            assert {k: r[k] for k in p if k not in PLAIN_ONLY} == {k: v for k, v in p.items() if k not in PLAIN_ONLY}
    assert all(r["reused"] for r in recs if r["variant"] == "base")
    n_run = sum(1 for j in {(r["job"], r["video"]) for r in recs if not r["reused"]})
    assert sum(s["n_prefixes"] for s in module.video_stats.values()) == n_run   # no baseline prefix in this run
    assert json.loads((out / "run.json").read_text())["baseline_run"] == str((runs["tmp"] / "plain").resolve())


def test_readmes_baseline_run_command_on_the_demo_folder_is_accepted(runs, tiny_vl3_dir, tmp_path):
    """README's ``baseline_run`` command for the demo folder carries the demo's decode budget (a plain predict decodes
    for its largest budget, 1024; without it the ablation's 16384 is refused): run as written, with the demo folder
    and the paths of this test's plain run (same largest budget, 1024) and a short job list."""
    import re
    import shlex

    import evaluate
    from callbacks.jsonl_writer import read_records

    readme = (REPO / "README.md").read_text()
    cmd = re.search(r"`(python evaluate.py predict --config configs/predict/ablate.yaml "
                    r"--model.init_args.baseline_run=outputs/demo[^`]*)`", readme)
    assert cmd, "README: no baseline_run command for the demo folder"
    args = shlex.split(cmd.group(1))[2:]
    assert "--model.init_args.decode_budget=1024" in args
    plain, out = runs["tmp"] / "plain", tmp_path / "from_demo"
    args = [a.replace("=outputs/demo", f"={plain}") for a in args if not a.startswith("--trainer.callbacks.init_args.out_dir=")]
    evaluate.cli_main([*args, f"--trainer.callbacks.init_args.out_dir={out}",
                       f"--model.init_args.model_path={tiny_vl3_dir}", f"--model.init_args.max_new_tokens={NEW_TOKENS}",
                       "--model.init_args.jobs=base:128,rho32:128", f"--data.init_args.root={runs['root']}",
                       "--data.init_args.loader_kwargs={}", "--data.init_args.num_workers=0"])
    recs = read_records(out)
    assert len(recs) == 2 * N_QUESTIONS and all(r["reused"] for r in recs if r["variant"] == "base")
    assert json.loads((out / "run.json").read_text())["decode_budget"] == 1024


def _refused(runs, tiny_vl3_dir, name, match, baseline, **kw):
    from callbacks.baseline_run import BaselineRunError

    out = runs["tmp"] / name
    with pytest.raises(BaselineRunError, match=match):
        run_ablation(tiny_vl3_dir, runs["root"], out, jobs=kw.pop("jobs", RUN_JOBS), baseline_run=str(baseline),
                     **kw)
    assert not out.exists()   # refused before anything is written


def test_baseline_run_refused_before_writing(runs, tiny_vl3_dir):
    plain = runs["tmp"] / "plain"
    _refused(runs, tiny_vl3_dir, "r_missing", r"no such folder", runs["tmp"] / "nowhere", decode_budget=1024)
    # the plain run decoded for its largest budget, 1024; the ablation's default decodes for 16384
    _refused(runs, tiny_vl3_dir, "r_decode", r"plain: decode_budget: 1024 there .* 16384 here", plain)
    _refused(runs, tiny_vl3_dir, "r_tokens", r"plain.*run.json was made with other settings \(max_new_tokens: 2 there, "
             r"3 here\)", plain, decode_budget=1024, max_new_tokens=3)
    _refused(runs, tiny_vl3_dir, "r_budget", r"budget 256: no b256/ or base_b256/ folder", plain,
             jobs="base:128,low64:256", decode_budget=1024)
    # a record missing for one video
    cut = runs["tmp"] / "plain_cut"
    shutil.copytree(plain, cut)
    f = cut / "b128" / "videomme" / "rank0.jsonl"
    f.write_text("".join(l for l in f.read_text().splitlines(keepends=True) if json.loads(l)["video"] != "realshort"))
    _refused(runs, tiny_vl3_dir, "r_records", r"budget 128: no record for 3 question\(s\) of 1 video\(s\), e.g. "
             r"video realshort", cut, decode_budget=1024)
    (cut / "run.json").unlink()
    _refused(runs, tiny_vl3_dir, "r_runjson", r"plain_cut: no readable run.json", cut, decode_budget=1024)


def test_baseline_run_with_another_plan_stops_the_run(runs, tiny_vl3_dir):
    from lightning_modules.budgeted_qa import VideoStepError

    bad = runs["tmp"] / "plain_bad"
    shutil.copytree(runs["tmp"] / "plain", bad)
    f = bad / "b1024" / "videomme" / "rank0.jsonl"
    lines = [json.loads(l) for l in f.read_text().splitlines()]
    for r in lines:
        r["vision_tokens"] += 1
    f.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(VideoStepError) as e:
        run_ablation(tiny_vl3_dir, runs["root"], runs["tmp"] / "from_bad", jobs="base:1024", decode_budget=1024,
                     baseline_run=str(bad))
    assert "plain_bad" in str(e.value.__cause__) and "vision_tokens" in str(e.value.__cause__)


# ----------------------------------------------------------------------------------------- model-level units


@pytest.fixture(scope="module")
def cockatoo():
    from datamodules.decode import decode_video

    return decode_video(MEDIA / "cockatoo.mp4", 1024)


def test_coinciding_grid_is_encoded_once_and_prompts_need_no_encode(tiny_vlm, cockatoo):
    from algorithms.budget import frame_grid
    from models.videollama3.ablation import build_layout_prompt, duplicate_encodes, encode_layout_inputs, plan_layout_jobs
    from models.videollama3 import EncodeCache

    dec = cockatoo
    cache = EncodeCache(tiny_vlm, dec.frames)
    # budget 64 encodes 8 frames at (6, 10); sel_resize@1024 (small = raw_frame_grid(12, 21, 64) = (6, 10)) and
    # low64@256 (capped, 4 frames encoded at (12, 21), raw at (6, 10)) re-encode from (12, 21) pixels in phase 2:
    # rows of their own, not the (6, 10) encode's
    jobs = [("sel_resize", 1024), ("low64", 256), ("mean_merge", 64), ("sel_merge", 1024)]
    lj = plan_layout_jobs(cache, jobs, raw_mode="orig")
    assert cache.grid_for(64) == frame_grid(720, 1280, 64) == lj[("base", 64)].geometry.grid == (6, 10)
    assert lj[("low64", 256)].geometry.grid == (12, 21) and lj[("low64", 256)].layout.raw_grid == (6, 10)
    encode_layout_inputs(cache, list(lj.values()))
    assert not duplicate_encodes(cache) and len(cache.encode_calls) == 3  # (6, 10), (9, 16), (12, 21)
    need = {lj[("low64", 256)].frame_idx[a] for a in lj[("low64", 256)].raw_positions()}
    need |= {lj[("sel_resize", 1024)].frame_idx[a] for a in lj[("sel_resize", 1024)].substitute_positions()}
    assert lj[("sel_resize", 1024)].layout.group_grid == (6, 10)
    assert cache.reencode_calls == [((12, 21), (6, 10), len(need))]      # both jobs' frames in one call
    n_calls = len(cache.encode_calls)
    cs = tiny_vlm.tokenizer.convert_tokens_to_ids("<|compression_start|>")
    for key, job in lj.items():
        prompt = build_layout_prompt(tiny_vlm, cache, job, dec.times_s, "orig")
        plan = job.layout.plan
        assert int((prompt.ids == tiny_vlm.placeholder_id).sum()) == prompt.vision_embeds.shape[0]
        assert prompt.vision_embeds.shape[0] == plan.vision_tokens <= job.budget
        swap = job.layout.group_substitute != "qbase"
        assert int((prompt.ids == cs).sum()) == (0 if swap else plan.n_compressed), key
    assert len(cache.encode_calls) == n_calls and len(cache.reencode_calls) == 1  # all encoded before the prompts


def test_base_prompt_equals_prepare_budgets(tiny_vlm, cockatoo):
    from models.videollama3.ablation import build_layout_prompt, encode_layout_inputs, plan_layout_jobs
    from models.videollama3 import EncodeCache, prepare_budgets

    dec = cockatoo
    budgets = [128, 1024]
    ref = prepare_budgets(tiny_vlm, dec.frames, dec.times_s, budgets, raw_mode="phase3", raw_max_tokens=64)
    cache = EncodeCache(tiny_vlm, dec.frames)
    lj = plan_layout_jobs(cache, [("base", b) for b in budgets], raw_mode="phase3", raw_max_tokens=64)
    encode_layout_inputs(cache, list(lj.values()))
    for bi in ref:
        job = lj[("base", bi.budget)]
        assert job.layout.plan == bi.plan and job.layout.raw_grid == bi.raw_grid
        prompt = build_layout_prompt(tiny_vlm, cache, job, dec.times_s, "phase3")
        assert torch.equal(prompt.ids, bi.prompt.ids) and prompt.last_text == bi.prompt.last_text
        assert torch.equal(prompt.vision_embeds, bi.prompt.vision_embeds)


def test_area_pool_rows():
    from models.videollama3.ablation import area_pool_rows

    rows = torch.arange(4 * 6, dtype=torch.float32).view(24, 1).repeat(1, 3)   # (gh*gw, C), grid (4, 6)
    out = area_pool_rows(rows, (4, 6), (2, 3))
    assert out.shape == (6, 3)
    assert out[0, 0].item() == (0 + 1 + 6 + 7) / 4
    assert area_pool_rows(rows, (4, 6), (4, 6)) is rows


def test_mean_merge_pools_in_fp32_and_casts_once():
    """Seed 000 build: ``grid[s:s + L].float().mean(0)``, ``adaptive_avg_pool2d`` on the fp32 stack, then
    ``.to(feats.dtype)``: one rounding to bf16, not two."""
    import torch.nn.functional as F

    from models.videollama3.ablation import mean_merge_rows

    g = torch.Generator().manual_seed(0)
    rows = (torch.randn(3, 4 * 6, 5, generator=g) * 3).to(torch.bfloat16)       # (L, gh*gw, C) group of 3 frames
    x = rows.view(3, 4, 6, 5).float().mean(0, keepdim=True)                     # the seed's code, written out
    ref = F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), (2, 3)).permute(0, 2, 3, 1).reshape(-1, 5).to(torch.bfloat16)
    out = mean_merge_rows(rows, (4, 6), (2, 3))
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    twice = mean_merge_rows(rows.float().mean(0).to(torch.bfloat16).unsqueeze(0), (4, 6), (2, 3))
    assert not torch.equal(twice, ref)                                           # the old double rounding differs


# ----------------------------------------------------------------------------------------- module and config


def test_jobs_property_and_errors():
    from lightning_modules.layout_ablation import LayoutAblationQA

    m = LayoutAblationQA(jobs="base:256:1024, rho32:1024", no_reuse=True)
    assert m.jobs == {"base_b256": 256, "base_b1024": 1024, "rho32_b1024": 1024}
    assert m.decode_budget == 16384   # seed 000: Videos(todo, 16384) whatever the jobs' budgets
    assert m.baseline_run is None and m.baseline_records is None   # default: the in-run baseline
    with pytest.raises(ValueError, match="model.init_args.baseline_run must be a run folder or null"):
        LayoutAblationQA(jobs="base:256", baseline_run="")
    assert m.budgets == [256, 1024] and m.hparams.jobs == "base:256:1024, rho32:1024" and m.hparams.no_reuse
    with pytest.raises(ValueError, match="unknown layout variant"):
        LayoutAblationQA(jobs="rho33:256")
    with pytest.raises(ValueError, match="smaller than one compressed group"):
        LayoutAblationQA(jobs="base:32")
    item = {"video_id": "v", "benchmark": "videomme", "error": "v.mp4: bad", "jobs": {"q1": ["rho32_b1024"]},
            "questions": [{"qid": "q1", "answer": "A", "meta": {}}]}
    (r,) = m.predict_step(item)
    assert r["variant"] == "rho32" and r["job"] == "rho32_b1024" and r["error"] == "v.mp4: bad" and not r["reused"]


def test_ablate_config_instantiates(tmp_path):
    import yaml

    import evaluate
    from algorithms.layouts import VARIANTS
    from datamodules.videoqa import VideoQADataModule
    from lightning_modules.layout_ablation import LayoutAblationQA

    path = REPO / "configs" / "predict" / "ablate.yaml"
    assert path.read_text().splitlines()[0] == "# python evaluate.py predict --config configs/predict/ablate.yaml"
    cfg = yaml.safe_load(path.read_text())
    assert cfg.pop("return_predictions") is False  # a predict-subcommand key; run=False has no subcommand
    plain = tmp_path / path.name
    plain.write_text(yaml.safe_dump(cfg))
    cli = evaluate.cli_main([f"--config={plain}"], run=False)
    assert isinstance(cli.datamodule, VideoQADataModule) and cli.datamodule.root == "assets"
    assert isinstance(cli.model, LayoutAblationQA)
    assert {v for v, _ in cli.model.job_pairs} == set(VARIANTS) and len(cli.model.jobs) == 3 * len(VARIANTS)
    assert cfg["model"]["init_args"]["baseline_run"] is None and cli.model.baseline_run is None
    writer = next(cb for cb in cli.trainer.callbacks if hasattr(cb, "done_qids"))
    assert writer.out_dir == Path("outputs/ablate")


@pytest.mark.parametrize("decode,expect", [("auto", "dynamic"), ("static", "static"), ("graph", "graph")])
def test_ablation_answers_through_plain_predicts_decode_path(decode, expect):
    """DESIGN §4: base with reuse off is bit-identical to plain predict, so both answer through the same decode
    step (on a GPU ``auto`` is ``graph``; the ablation used to take ``dynamic`` whatever ``decode`` said)."""
    import functools
    from types import SimpleNamespace

    from lightning_modules.budgeted_qa import BudgetedQA
    from lightning_modules.layout_ablation import LayoutAblationQA

    def batched(prompt, texts, n, decode=None):
        return decode

    vlm = SimpleNamespace(answer_batched=batched, answer_all=lambda *a: "sequential")
    for module in (BudgetedQA(decode=decode), LayoutAblationQA(jobs="base:256", decode=decode)):
        module.vlm = vlm
        fn = module.answerer()
        assert isinstance(fn, functools.partial) and fn("p", ["q"], 4) == expect   # CPU: auto -> dynamic
    for module in (BudgetedQA(decode=decode), LayoutAblationQA(jobs="base:256", decode=decode)):
        module.vlm = vlm
        module._device = torch.device("cuda", 0)        # placed on a GPU (only the mode is read, nothing runs)
        assert module.answerer()("p", ["q"], 4) == (expect if decode != "auto" else "graph")   # issue 41
    seq = LayoutAblationQA(jobs="base:256", answer_mode="sequential", decode=decode)
    seq.vlm = vlm
    assert seq.answerer()("p", ["q"], 4) == "sequential"


def test_prompt_template_default_is_videollama3s_own():
    from algorithms.errors import SettingError
    from datamodules.benchmarks import Question
    from lightning_modules.budgeted_qa import BudgetedQA

    qs = [Question(qid=f"{b}-1", video_id="v", video_path="/v.mp4", question="Q?", options=["a", "b", "c", "d"], answer="A",
                   meta={"benchmark": b}) for b in ("videomme", "mlvu", "lvb")]
    texts, names = BudgetedQA().prompts(qs)
    assert names == ["videollama3_videomme", "videollama3_mlvu", "videollama3_lvb"]
    # VideoLLaMA3@05cee23d evaluation/benchmarks/{videomme,mlvu,longvideobench}.py generate_instruction
    assert texts[0] == ("Select the best answer to the following multiple-choice question based on the video. "
                        "Respond with only the letter (A, B, C, or D) of the correct option.\nQ?\nA. a\nB. b\nC. c\n"
                        "D. d\nAnswer with the option's letter from the given choices directly and only give the "
                        "best option. The best answer is:")
    assert texts[1] == ("Question: Q?\nOptions:\n(A) a\n(B) b\n(C) c\n(D) d\nAnswer with the option's letter from "
                        "the given choices directly and only give the best option.")
    assert texts[2] == ("Question: Q?\nA. a\nB. b\nC. c\nD. d\n"
                        "Answer with the option's letter from the given choices directly.")
    assert BudgetedQA(prompt_template="videomme").prompts(qs)[1] == ["videomme"] * 3
    assert BudgetedQA(prompt_template="mcq_letter").prompts(qs)[1] == ["mcq_letter"] * 3
    with pytest.raises(SettingError, match="prompt_template 'vmme' is unknown"):
        BudgetedQA(prompt_template="vmme")
    with pytest.raises(SettingError, match="decode must be one of"):
        BudgetedQA(decode="cuda_graph")
    with pytest.raises(SettingError, match="model.init_args.overlap_budgets must be true or false, got None"):
        BudgetedQA(overlap_budgets=None)
    with pytest.raises(SettingError, match="model.init_args.cudnn_attention must be true or false, got 'yes'"):
        BudgetedQA(cudnn_attention="yes")


def test_answer_texts_puts_each_templates_system_prompt_and_answer_prefix():
    from datamodules.benchmarks.prompts import chat_parts
    from lightning_modules.budgeted_qa import BudgetedQA

    class FakeVLM:
        def with_chat(self, prompt, system, prefix, pre):
            return (prompt, system, prefix, pre)

    m = BudgetedQA(max_new_tokens=3)
    m.vlm = FakeVLM()
    calls = []

    def answer(p, texts, n):
        calls.append((p, texts, n))
        return [f"{t}@{p}" for t in texts]

    out = m.answer_texts(answer, "P", ["m1", "v1", "m2"], ["mlvu", "videollama3_mlvu", "mlvu"])
    mlvu_prompt = ("P",) + chat_parts("mlvu") + ("",)
    assert calls == [(mlvu_prompt, ["m1", "m2"], 3), ("P", ["v1"], 3)]   # one prefix per (system, prefix)
    assert out == [f"m1@{mlvu_prompt}", "v1@P", f"m2@{mlvu_prompt}"]      # in the order of the texts


def test_starter_starts_every_prefix_before_any_decoding():
    """``overlap_budgets``: ``start_texts`` launches each template group's prefix at once; decoding happens only in
    the returned ``finish`` (answers in the order of the texts). Sequential mode answers at start."""
    from lightning_modules.budgeted_qa import BudgetedQA

    events = []

    class FakeVLM:
        def with_chat(self, prompt, system, prefix, pre):
            return prompt + "+chat"

        def start_batched(self, p, texts, n, decode=None):
            events.append(("start", p, tuple(texts), decode))
            return lambda: events.append(("finish", p)) or [f"{t}@{p}" for t in texts]

        def answer_all(self, p, texts, n):
            events.append(("all", p))
            return [f"{t}!" for t in texts]

    m = BudgetedQA(decode="static")
    m.vlm = FakeVLM()
    start = m.starter()
    f1 = m.start_texts(start, "P1", ["m1", "v1"], ["mlvu", "videollama3_mlvu"])
    f2 = m.start_texts(start, "P2", ["v2"], ["videollama3_mlvu"])
    assert [e[0] for e in events] == ["start", "start", "start"]          # nothing decoded yet
    assert events[0] == ("start", "P1+chat", ("m1",), "static") and events[2] == ("start", "P2", ("v2",), "static")
    assert f2() == ["v2@P2"] and f1() == ["m1@P1+chat", "v1@P1"]
    assert [e[0] for e in events[3:]] == ["finish", "finish", "finish"]
    seq = BudgetedQA(answer_mode="sequential")
    seq.vlm = FakeVLM()
    events.clear()
    fin = seq.start_texts(seq.starter(), "P", ["a"], ["videollama3_mlvu"])
    assert events == [("all", "P")] and fin() == ["a!"]


def test_cudnn_attention_is_recorded_only_when_on_and_set_process_wide(tiny_vl3_dir, monkeypatch):
    """``cudnn_attention`` changes kernels (bf16 rounding), so a folder records it; off (the default) it is left out,
    so folders written before the setting existed still resume. ``on_predict_start`` applies it process-wide."""
    from lightning_modules.budgeted_qa import BudgetedQA
    from models import vision_attention

    assert "cudnn_attention" not in BudgetedQA(model_path=str(tiny_vl3_dir)).record_settings()
    on = BudgetedQA(model_path=str(tiny_vl3_dir), cudnn_attention=True)
    assert on.record_settings()["cudnn_attention"] is True
    monkeypatch.setattr(BudgetedQA, "load_model", lambda self: None)
    try:
        on.on_predict_start()
        assert vision_attention._CUDNN_ALLOWED == [True]
        BudgetedQA(model_path=str(tiny_vl3_dir)).on_predict_start()
        assert vision_attention._CUDNN_ALLOWED == [False]
    finally:
        vision_attention.allow_cudnn_sdpa(False)
