"""bench/qa_step_profile.py: the GPU-idle accounting on hand-made intervals, and a CPU smoke run of the real
``BudgetedQA.predict_step`` with every host stage wrapped in a profiler range."""

from tests.conftest import load_bench_script


def _bench():
    return load_bench_script("qa_step_profile")


def test_union_merges_overlapping_kernel_intervals():
    bench = _bench()
    # kernels [0, 4) and [2, 5) overlap, [5, 6) touches, [8, 9) stands alone: busy 7 of the span, one 2-wide gap
    assert bench.union([(8, 9), (2, 5), (0, 4), (5, 6)]) == [(0, 6), (8, 9)]
    assert bench.classify("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert bench.classify("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<96>>") == "attention"
    assert bench.classify("triton_per_fused_add_native_layer_norm_1") == "triton (fused)"


def test_tiny_run_times_every_host_stage(bench_tiny_model_from_session, capsys):
    # (its tiny model: the session's checkpoint, see the fixture; one budget: every stage runs at B = 128 too, the
    # cockatoo steps at 128 alone cost a third of those with 1024's 12 x 21 grids)
    _bench().main(["--tiny", "--no-cprofile", "--budgets", "128"])
    out = capsys.readouterr().out
    assert "## warm-up step cockatoo.mp4" in out and "## profiled steady step, realshort.mp4" in out
    table = out.split("host stage")[1].split("\n\n")[0]
    for stage in ("step", "encode", "plan", "compress", "build_prompt", "prefill", "question_ids", "decode"):
        assert f"\n{stage} " in table, stage
    assert "same video again:" in out


def test_loader_contention_runs_the_clis_loader_beside_the_steps(monkeypatch):
    """``--loader-contention``'s plumbing: per configuration a real decode loader (1 worker over a bundled clip,
    cycled) runs while the seen videos are stepped; the first configuration is the ratios' base; the rows say what
    ran. The module is a stand-in whose step takes 20 ms (the bench times the real one)."""
    import time
    from types import SimpleNamespace

    from tests.conftest import MEDIA

    bench = _bench()
    module = SimpleNamespace(budgets=[128], frame_sizing=lambda: None,
                             predict_step=lambda item: time.sleep(0.02) or [])
    items = [{}, {"video_path": "a"}, {"video_path": "b"}]
    rows = bench.loader_contention(module, items, [str(MEDIA / "realshort.mp4")],
                                   [("cpu", 0, 0, False), ("cpu", 1, 5, False)], settle_s=1.0)
    assert [(r["decoder"], r["workers"], r["niceness"], len(r["steps_s"])) for r in rows] == [
        ("cpu", 0, 0, 4), ("cpu", 1, 5, 4)]
    assert rows[0]["ratio"] == 1.0 and rows[0]["videos_per_s"] == 0.0
    assert all(t >= 0.02 for r in rows for t in r["steps_s"]) and rows[1]["videos_per_s"] >= 0.0
