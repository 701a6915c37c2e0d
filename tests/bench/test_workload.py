"""bench/workload.py: the looped set, the frame plan, the decode tasks and the table's arithmetic (fast); the whole
``--tiny`` run with the CLI (slow)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datamodules.decode import nvdec  # noqa: F401  (before decord, as the bench does)
from tests.media_factory import ffmpeg_exe

from tests.conftest import load_bench_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "workload.py"


def _bench():
    return load_bench_script("workload")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("workload") / "s1_base.mp4"
    subprocess.run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=160x90:rate=25", "-t",
                    "2", "-c:v", "libx264", "-bf", "3", "-g", "25", "-pix_fmt", "yuv420p", str(out)], check=True)
    return out


def test_loop_repeats_the_segment_exactly(base):
    """A 2 s segment looped to 5 s: ceil(5 / 2) = 3 copies, 150 frames, each copy decoding to the same pixels."""
    import decord

    bench = _bench()
    out = base.with_name("s1_looped.mp4")
    bench._loop(base, out, 5)
    vr = decord.VideoReader(str(out))
    assert len(vr) == 150
    frames = vr.get_batch(list(range(150))).asnumpy()
    assert np.array_equal(frames[:50], frames[50:100]) and np.array_equal(frames[:50], frames[100:])
    assert vr.get_frame_timestamp(149)[0] == pytest.approx(149 / 25, abs=1e-3)


def test_plan_is_seed_sampling(base):
    """6 s at 25 fps under 16,384 tokens: 1 fps; the fps filter (round=down) emits for grid time j the last frame
    shown before the next grid time (j + 1) s, frame 25 (j + 1) - 1: 24, 49, ..., 149."""
    bench = _bench()
    out = base.with_name("s1_6s.mp4")
    bench._loop(base, out, 6)
    p = bench.plan(out)
    assert p["n"] == 150 and p["idx"] == [24, 49, 74, 99, 124, 149] and p["decode_hw"] == (90, 160)


def test_decode_tasks_agree_and_record_the_decoder(base):
    """The cpu task and the nvdec task (which, without a GPU, falls back to the CPU with the reason) hash the same
    frames (24 and 49 of the 2 s clip); a 1 s window keeps the sampled frames before frame 25 (only 24) and counts
    25 source frames."""
    bench = _bench()
    cpu = bench._decode_task((str(base), "cpu", 1, 4, None))
    nv = bench._decode_task((str(base), "nvdec", 1, 4, None))
    assert cpu["frames"] == nv["frames"] == 2 and cpu["sha1"] == nv["sha1"]
    assert cpu["decoder"] == "cpu" and cpu["why"] is None
    assert nv["decoder"] in ("nvdec", "cpu") and (nv["decoder"] == "nvdec") == (nv["why"] is None)
    win = bench._decode_task((str(base), "cpu", 1, 4, 1.0))
    assert (win["frames"], win["covered"], win["n"]) == (1, 25, 50)


def test_parts_merge_into_the_whole_videos_row(base):
    """The pool's parts (``--part-mb``, as ``data.decode_part_mb`` cuts a video): the two parts of the clip's 2 sampled
    frames join into one row whose hash is the whole decode's; the window runs from the first part's start to the
    last one's end; copies stay apart."""
    bench = _bench()
    whole = bench._decode_task((str(base), "cpu", 1, 4, None))
    parts = [bench._decode_task((str(base), "cpu", 1, 4, None, (k, 2), c)) for c in (0, 1) for k in (1, 0)]
    assert [p["frames"] for p in parts] == [1, 1, 1, 1]
    parts[1]["window_unix"], parts[0]["window_unix"] = [10.0, 11.0], [10.5, 12.5]
    rows = bench.merge_parts(parts)
    assert len(rows) == 2 and all(r["sha1"] == whole["sha1"] and r["frames"] == 2 and r["parts"] == 2 for r in rows)
    assert rows[0]["window_unix"] == [10.0, 12.5] and rows[0]["decode_s"] == 2.5 and "digests" not in rows[0]
    assert bench.merge_parts([whole])[0]["sha1"] == whole["sha1"]


def test_cpu_skip_task_equals_cpu_and_counts_skipped(base):
    """The packet-filtered CPU decode (PyAV fed only the needed packets, decord's swscale) hashes the same frames
    as decord; of the 50 frames (GOP 25, 3 B-frames), frames 24 and 49 need neither the non-reference B-frames
    before them nor anything after 49, so some are never decoded; with a 1 s window the count is of the first 25
    frames only."""
    bench = _bench()
    cpu = bench._decode_task((str(base), "cpu", 1, 4, None))
    skip = bench._decode_task((str(base), "cpu_skip", 1, 4, None))
    assert skip["decoder"] == "cpu_skip" and skip["sha1"] == cpu["sha1"]
    assert skip["packets"] == 50 and 0 < skip["frames_skipped"] < 50
    win = bench._decode_task((str(base), "cpu_skip", 1, 4, 1.0))
    assert win["packets"] == 25 and 0 < win["frames_skipped"] < 25
    assert cpu["frames_skipped"] is None


def test_summary_arithmetic():
    """One long video, decoded in 10 s over 1,000 of its 10,000 frames at 25 fps (400 s), step 2 s, 4 workers:
    100 s per whole video, wall max(2, 100 / 4) = 25 s, wait 1 - 2 / 25 = 92 %, 144 videos/h; full Video-MME long
    class: 300 x max(2, 0.01 s/frame x 2466 s x 25 fps / 4) = 300 x 154.125 s = 12.84 h."""
    bench = _bench()
    rows = {"cpu": [{"path": "/x/l1_a.mp4", "decode_s": 10.0, "covered": 1000, "n": 10000, "duration_s": 400.0,
                     "decoder": "cpu"}]}
    s = bench.summarize(rows, {"short": 1.0, "medium": 2.0, "long": 2.0}, workers=4, pool_wall_s={"cpu": 20.0})
    c = s["cpu"]["classes"]["long"]
    assert c["decode_s"] == pytest.approx(100.0) and c["wait_share"] == pytest.approx(0.92)
    assert c["videos_per_h"] == pytest.approx(144.0)
    assert s["cpu"]["videomme_h"] == pytest.approx(300 * 154.125 / 3600)
    # pool: 1,000 frames / 20 s = 50 frames/s; 300 x 2466 x 25 frames / 50 = 369,900 s
    assert s["cpu"]["pool_fps"] == pytest.approx(50.0)
    assert s["cpu"]["videomme_h_pool"] == pytest.approx(369900 / 3600)


@pytest.mark.slow
def test_tiny_run(tmp_path):
    """The whole CPU smoke run: the tiny set, both paths in pools, the CLI on the tiny model, the table."""
    out = subprocess.run([sys.executable, str(BENCH), "--tiny", "--videos", str(tmp_path / "set")],
                         capture_output=True, text=True, check=True, cwd=BENCH.parent.parent).stdout
    assert "frames identical cpu vs nvdec: 3 of 3 videos" in out
    assert "GPU step per video from: the CLI's timing_rank0.json" in out
    assert "CLI decoder=cpu: busy from the first decode to the end" in out and "NVDEC -, SM -, CPU " in out
    assert "full Video-MME (900 videos, 4k+16k, one GPU)" in out
    for cls in ("short", "medium", "long"):
        assert f"\n{cls:<7} cpu " in out and f"\n{cls:<7} nvdec " in out


def test_simulated_run_hand_cases():
    """simulate_run against pipelines worked out by hand (in-order DataLoader, shared decode engine)."""
    sim = _bench().simulate_run
    # one worker, engine faster than the video's solo rate: v0 decodes 0-10 s, v1 10-20 s; steps of 1 s at 10, 20
    r = sim([100, 100], [1, 1], workers=1, solo_fps=[10, 10], capacity_fps=1000)
    assert r["arrive_s"] == [10, 20] and r["start_s"] == [10, 20] and r["wall_s"] == 21
    assert abs(r["wait_share"] - (1 - 2 / 21)) < 1e-12
    # two workers sharing an engine of one video's rate: both decode at 5 frames/s, both arrive at 20 s
    r = sim([100, 100], [1, 1], workers=2, solo_fps=[10, 10], capacity_fps=10)
    assert r["arrive_s"] == [20, 20] and r["start_s"] == [20, 21] and r["wall_s"] == 22
    # rates change when a decode ends: v0 (50 frames) and v1 (150) share 10 frames/s: v0 ends at 10 s, then v1
    # runs alone at its solo 10 frames/s: 100 frames left at 10 s -> arrives at 20 s
    r = sim([50, 150], [2, 2], workers=2, solo_fps=[10, 10], capacity_fps=10)
    assert r["arrive_s"] == [10, 20] and r["start_s"] == [10, 20] and r["wall_s"] == 22
    # prefetch: 1 worker x prefetch 1 -> v1 is sent only when the step takes v0 (at 1 s), v2 when it takes v1
    r = sim([10, 10, 10], [5, 5, 5], workers=1, solo_fps=[10, 10, 10], capacity_fps=100, prefetch=1)
    assert r["arrive_s"] == [1, 2, 7] and r["start_s"] == [1, 6, 11] and r["wall_s"] == 16
    # GPU-bound: decoding far ahead, the GPU never waits after the first video
    r = sim([1] * 10, [1] * 10, workers=4, solo_fps=[100] * 10, capacity_fps=1000)
    assert r["wall_s"] == 0.01 + 10 and abs(r["wait_share"] - 0.01 / 10.01) < 1e-12
    with pytest.raises(ValueError, match="one entry per video"):
        sim([1, 2], [1], 1, [1, 1], 1)


def test_simulated_run_out_of_order_hand_cases():
    """simulate_run(in_order=False), as the CLI's loader delivers (worked out by hand from torch's
    ``_try_put_index``: a taken video frees its worker's slot, the next video goes to the next worker in the cycle
    with a free slot)."""
    sim = _bench().simulate_run
    # 2 workers, 1 slot each: v0 (10 s) on w0, v1 (1 s) on w1. v1 arrives at 1 and is stepped 1-2; its slot sends v2
    # to w1 (w0's slot is full), decoded 1-2, stepped 2-3; v0 arrives at 10, stepped 10-11
    r = sim([10, 1, 1], [1, 1, 1], workers=2, solo_fps=[1, 1, 1], capacity_fps=float("inf"), prefetch=1,
            in_order=False)
    assert r["arrive_s"] == [10, 1, 2] and r["start_s"] == [10, 1, 2] and r["wall_s"] == 11
    # in order the same run steps v0 first (10-11), v1 (11-12), and v2 is sent to w0 only at 10: decoded 10-11,
    # stepped 12-13
    r = sim([10, 1, 1], [1, 1, 1], workers=2, solo_fps=[1, 1, 1], capacity_fps=float("inf"), prefetch=1)
    assert r["start_s"] == [10, 11, 12] and r["wall_s"] == 13
    # one worker, 2 slots: its videos in its queue's order, whatever the order of taking
    r = sim([10, 10, 10], [5, 5, 5], workers=1, solo_fps=[10, 10, 10], capacity_fps=100, prefetch=2, in_order=False)
    assert r["arrive_s"] == [1, 2, 3] and r["start_s"] == [1, 6, 11] and r["wall_s"] == 16
    # a shared engine: 2 decodes in flight at 5 frames/s each; v1 (50 frames) ends at 10 s and is stepped first
    r = sim([150, 50], [2, 2], workers=2, solo_fps=[10, 10], capacity_fps=10, in_order=False)
    assert r["arrive_s"] == [20, 10] and r["start_s"] == [20, 10] and r["wall_s"] == 22


def test_videomme_run_is_the_decode_bound_when_the_engine_is_slow():
    """900 videos whose decode needs far more than the GPU: the simulated wall is the engine's time for all the
    source frames, never less, and within 0.1 % more (moments when in-order delivery holds a worker back); with
    decoding instant it is the GPU's sum."""
    bench = _bench()
    rows = [{"path": f"/x/{c}1.mp4", "covered": 3000, "n": 3000, "duration_s": 100.0, "decode_s": 1.0}
            for c in "sml"]
    steps = {"short": 1.0, "medium": 2.0, "long": 2.0}
    slow = bench.videomme_run(rows, steps, 8, capacity_fps=1000)
    frames = sum(count * mean_s * 30 for count, mean_s in bench.VIDEO_MME.values())
    assert abs(slow["source_frames"] - frames) < 1e-6
    assert frames / 1000 <= slow["hours"] * 3600 <= frames / 1000 * 1.001
    instant = [dict(r, decode_s=1e-6) for r in rows]     # decoding at 3e9 frames/s: the GPU alone bounds the run
    fast = bench.videomme_run(instant, steps, 8, capacity_fps=float("inf"))
    assert abs(fast["hours"] * 3600 - 1500.0) < 1.0 and fast["wait_share"] < 1e-3   # 300 x 1 s + 600 x 2 s


def test_steady_rate_counts_frames_evenly_over_each_window_up_to_the_last_start():
    from bench.workload import steady_rate

    # worker A: 0-10 s, 100 frames; B: 0-4 s, 40 frames, then 4-20 s, 160 frames (the last job starts at 4 s)
    w = [(0.0, 10.0, 100.0), (0.0, 4.0, 40.0), (4.0, 20.0, 160.0)]
    r = steady_rate(w)
    assert r["steady_s"] == 4.0
    assert r["steady_fps"] == (100 * 4 / 10 + 40) / 4      # 20 frames/s: A's 40 of 100 + B's first 40
    assert steady_rate([(0.0, 5.0, 10.0), (0.0, 3.0, 9.0)]) == {"steady_s": None, "steady_fps": None}
    assert steady_rate([]) == {"steady_s": None, "steady_fps": None}


def test_wait_figures_of_a_cli_timing_by_hand():
    """A run: load 5 s, first video waited 3 s and stepped 2 s, then 3 steps of 1 s with 1 s of waits between:
    wall 5 + 3 + 2 + 3 + 1 = 14 s; after the load 9 s, 4 s of it waiting; after the first video 4 s, 1 s waiting."""
    from bench.workload import wait_figures

    timing = {"wall_s": 14.0, "stages_s": {"load": 5.0, "wait": 4.0}, "first_wait_s": 3.0,
              "step_s": [2.0, 1.0, 1.0, 1.0]}
    f = wait_figures(timing)
    assert f["wait_share"] == pytest.approx(4 / 9) and f["steady_wait_share"] == pytest.approx(1 / 4)
    assert f["wall_over_steps"] == pytest.approx(4 / 3)


def test_cli_variant_settings_become_data_or_model_options():
    """``--cli-decoders auto/decode_part_mb=0/model.first_step=eager``: data settings go to ``--data.init_args``,
    ``model.`` ones to ``--model.init_args``; a name other than the three decoders, or a part without ``=``, is
    refused."""
    import argparse

    workload = _bench()
    spec = workload._cli_variant("auto/decode_part_mb=0/model.first_step=eager")
    assert [workload._cli_option(o) for o in spec.split("/")[1:]] == [
        "--data.init_args.decode_part_mb=0", "--model.init_args.first_step=eager"]
    for bad in ("gpu", "auto/decode_part_mb"):
        with pytest.raises(argparse.ArgumentTypeError):
            workload._cli_variant(bad)
    # env.NAME=value parts: the run's environment, not options
    opts = workload._cli_variant("auto/env.TOKENBUDGET_EARLY_CUDA=0/model.kernels=eager").split("/")[1:]
    assert workload._cli_env(opts) == {"TOKENBUDGET_EARLY_CUDA": "0"}
    assert workload._cli_env(["x=1", "model.y=2"]) == {}


def test_record_differences_name_the_fields(tmp_path):
    """The records comparison names, per differing record, the fields that differ (``video_info``'s one level
    down), and a record the other folder lacks; ``video_info.decoder`` is left out as in ``compare_records``."""
    import json

    workload = _bench()

    def write(root, recs):
        f = root / "b4096" / "videomme" / "rank0.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return root

    a = write(tmp_path / "a", [{"qid": "1", "budget": 4096, "pred": "A", "video_info": {"decoder": "nvdec", "n": 3}},
                               {"qid": "2", "budget": 4096, "pred": "B", "video_info": {"n": 3}},
                               {"qid": "3", "budget": 4096, "pred": "C"}])
    b = write(tmp_path / "b", [{"qid": "1", "budget": 4096, "pred": "A", "video_info": {"decoder": "cpu", "n": 3}},
                               {"qid": "2", "budget": 4096, "pred": "D", "video_info": {"n": 4}}])
    assert workload.compare_records(a, b) == (1, 3)
    assert workload.record_differences(a, b) == [
        "('b4096', '2', 4096, None): pred 'B' -> 'D'; video_info.n '3' -> '4'",
        "('b4096', '3', 4096, None): missing"]
    assert workload.differing_fields(a, b) == {"missing": 1, "pred, video_info.n": 1}


def test_differing_fields_count_every_record_and_the_unchecked_flag_apart(tmp_path):
    """All records are counted (not only the first few printed); ``concealment_checked`` (false where NVDEC
    decoded, absent on the CPU) is a field that differs, and leaving it out too gives the equality of the rest."""
    import json

    workload = _bench()
    for name, flag in (("nv", {"decoder": "nvdec", "concealment_checked": False}), ("cpu", {"decoder": "pyav_sws"})):
        f = tmp_path / name / "b4096" / "videomme" / "rank0.jsonl"
        f.parent.mkdir(parents=True)
        recs = [{"qid": str(i), "budget": 4096, "pred": "A", "video_info": {"n": 3, **flag}} for i in range(5)]
        if name == "cpu":
            recs[4]["pred"] = "B"
        f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    nv, cpu = tmp_path / "nv", tmp_path / "cpu"
    assert workload.compare_records(nv, cpu) == (0, 5)
    assert workload.differing_fields(nv, cpu) == {"video_info.concealment_checked": 4,
                                                  "pred, video_info.concealment_checked": 1}
    drop = workload.READER_FIELDS + (workload.UNCHECKED_FIELD,)
    assert workload.compare_records(nv, cpu, drop) == (4, 5)


def test_util_summary_within_a_window_and_a_cli_runs_window():
    """The busy shares of the samples inside a perf_counter window, by hand; a CLI run's window is its first
    decode's start to its predict end, shifted by the launch time; without those marks, every sample."""
    workload = _bench()
    u = workload.UtilSampler()
    u.cpu, u.cpu_at = [0.1, 0.5, 0.9, 0.3], [1.0, 2.0, 3.0, 4.0]
    u.gpu, u.gpu_at = [(0.2, 1.0), (0.4, 0.5), (0.8, 0.0)], [1.5, 2.5, 3.5]
    s = u.summary((2.0, 3.6))
    assert s["cpu_busy"] == {"mean": 0.7, "p90": 0.5} and s["samples"] == 2      # 0.5, 0.9: p90 index int(0.9)=0
    assert s["gpu_sm_busy"] == {"mean": 0.6, "p90": 0.4} and s["nvdec_busy"] == {"mean": 0.25, "p90": 0.0}
    assert u.summary()["samples"] == 4 and u.summary()["nvdec_busy"]["mean"] == 0.5
    got = workload.cli_util(u, 0.5, {"first_decode_start": 1.5, "predict_end": 3.1})   # window 2.0-3.6
    assert got["window_s"] == (1.5, 3.1) and got["cpu_busy"] == s["cpu_busy"]
    assert workload.cli_util(u, 0.5, {})["window_s"] is None and workload.cli_util(u, 0.5, {})["samples"] == 4


def test_cli_run_lines_give_the_first_steps_stages_beside_the_others(capsys):
    """``print_cli_run``: the first step's stages and the mean of the others' (hand-made timing: encode 2.0 against
    (1.0 + 0.5) / 2 = 0.75)."""
    rows = [{"video_id": "a", "wait_s": 0.0, "stages_s": {"encode": 2.0, "plan_build": 0.3, "answer": 1.5}},
            {"video_id": "b", "wait_s": 0.1, "stages_s": {"encode": 1.0, "plan_build": 0.1, "answer": 0.75}},
            {"video_id": "c", "wait_s": 0.0, "stages_s": {"encode": 0.5, "plan_build": 0.1, "answer": 1.25}}]
    t = {"step_s": [3.8, 1.9, 1.9], "first_answer_s": 24.4, "wait_share": 0.02, "steady_wait_share": 0.05,
         "wall_over_steps": 1.05, "decoders": {"nvdec": 3}, "timeline_s": {"module_built": 7.9}, "per_video": rows}
    _bench().print_cli_run("auto", t, 3)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("CLI decoder=auto: first step's stages (s) encode 2.00, plan_build 0.30, answer 1.50; "
                       "mean of the other 2: encode 0.75, plan_build 0.10, answer 1.00")
