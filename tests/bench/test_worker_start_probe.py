"""bench/worker_start_probe.py: N forkserver workers released together, each timing a first NVDEC read's phases;
on a machine without NVDEC each reports the reason the file would go to the CPU, the one the worker would record."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_workers_report_phases_and_the_cpu_reason(tmp_path):
    from datamodules.decode.nvdec_plan import nvdec_unsupported

    video = REPO / "assets" / "media" / "cockatoo.mp4"
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "worker_start_probe.py"), "--video", str(video),
                        "--procs", "2", "--frames", "3", "--json", str(out)], cwd=REPO, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    (res,) = json.loads(out.read_text())
    assert res["n"] == 2 and len(res["rows"]) == 2
    why = nvdec_unsupported(video)
    assert why   # (a 4:4:4 clip: never NVDEC's)
    for row in res["rows"]:
        assert row["why"] == why and row["sessions"] == []
        assert all(row[k] >= 0 for k in ("avail", "caps", "ctx", "read"))
        assert row["start_unix"] <= row["end_unix"]
    assert f"(not NVDEC: {{'{why}'}})" in r.stdout
