"""callbacks.step_profile: the step's kernel summary on hand-made intervals, the run/alone comparison, and the
callback in a real predict run of the tiny model (the profiled step, then the same item again, nothing written
twice)."""
import json

import pytest

from callbacks.step_profile import classify, compare, summarize, thread_schedstat, union


def test_union_merges_overlapping_and_touching_intervals():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4), (8, 9)]) == [(0, 4), (5, 7), (8, 9)]
    assert union([]) == []


def test_classify_names_the_kernel_classes():
    assert classify("void flash_fwd_kernel<...>") == "attention"
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert classify("nvjet_tst_128x256") == "gemm"
    assert classify("triton_rmsnorm_kernel") == "triton (fused)"
    assert classify("Memcpy DtoD (Device -> Device)") == "copy/set"
    assert classify("elementwise_kernel") == "other"


def test_summarize_on_hand_made_kernels():
    # span 0..100 us; kernels: gemm 10-30, gemm 20-40 (overlaps: busy 10-40 = 30 us, kernel time 40 us),
    # attention 50-60, and one half outside the span (90-120 -> counted 90-100)
    kernels = [("gemm_a", 10, 30), ("gemm_a", 20, 40), ("flash_fwd", 50, 60), ("elementwise", 90, 120),
               ("elementwise", 150, 160)]
    s = summarize(kernels, 0, 100)
    assert s["span_ms"] == 0.1
    assert s["busy_ms"] == pytest.approx(0.05)          # 30 + 10 + 10 us
    assert s["kernel_ms"] == pytest.approx(0.06)        # 20 + 20 + 10 + 10 us
    assert s["gap_ms"] == pytest.approx(0.05)
    assert s["busy_share"] == 0.5
    assert s["by_class_ms"] == {"gemm": 0.04, "attention": 0.01, "other": 0.01}
    assert s["kernels"] == 4
    assert s["by_name"]["gemm_a"] == [0.04, 2]


def test_compare_gives_ratios_and_the_kernels_that_grew():
    run = summarize([("gemm_a", 0, 40), ("flash", 40, 50)], 0, 100)       # gemm 40 us, attention 10 us
    alone = summarize([("gemm_a", 0, 20), ("flash", 20, 30)], 0, 40)      # gemm 20 us, attention 10 us
    c = compare(run, alone)
    assert c["kernel"] == pytest.approx(50 / 30, abs=1e-3)
    assert c["by_class"] == {"gemm": 2.0, "attention": 1.0}
    assert c["gap_ms_added"] == pytest.approx(0.05 - 0.01)
    assert c["top_added"][0][0] == "gemm_a" and c["top_added"][0][1:] == [0.04, 0.02, 1, 1]


def test_thread_schedstat_counts_this_threads_cpu_time():
    a = thread_schedstat()
    if a is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    x = 0
    for i in range(2_000_000):
        x += i
    b = thread_schedstat()
    assert b[0] > a[0] and b[1] >= a[1]


def test_step_profile_in_a_predict_run(tiny_vl3_dir, demo_bench, tmp_path):
    """The user's predict with the callback added: step 1 profiled in the run and again at the end; the records are
    those of the run without it (the second pass writes nothing)."""
    from tests.conftest import run_predict

    prof = tmp_path / "sp.json"
    add = "--trainer.callbacks+=" + json.dumps({"class_path": "callbacks.step_profile.StepProfile",
                                                "init_args": {"steps": [1], "path": str(prof)}})
    with_profile = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "out", budgets=(128,), extra=[add])
    plain = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "plain", budgets=(128,))
    steps = json.loads(prof.read_text())["steps"]
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["run"]["wall_s"] > 0 and steps[0]["alone"]["wall_s"] > 0 and "ratio" in steps[0]

    def answers(rows):
        return sorted((r["job"], r["qid"], r["response"]) for r in rows)

    assert answers(with_profile) == answers(plain)
    assert len(with_profile) == len({(r["job"], r["qid"]) for r in with_profile}) == len(plain)
