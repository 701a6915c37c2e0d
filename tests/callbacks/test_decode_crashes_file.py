"""``<out_dir>/decode_crashes.txt`` (the files that killed a decode worker): a file edited by hand stays readable."""
from __future__ import annotations

from callbacks.jsonl_writer import DECODE_CRASHES, JsonlPredictionWriter


def test_a_name_appended_to_a_file_without_its_last_newline_gets_a_line_of_its_own(tmp_path):
    (tmp_path / DECODE_CRASHES).write_text("/data/a.mp4", encoding="utf-8")   # written by hand, no final newline
    writer = JsonlPredictionWriter(out_dir=str(tmp_path))
    writer.record_decode_crashes(["/data/b.mp4"])
    writer.record_decode_crashes(["/data/c.mp4"])
    assert (tmp_path / DECODE_CRASHES).read_text(encoding="utf-8") == "/data/a.mp4\n/data/b.mp4\n/data/c.mp4\n"
    assert writer.decode_crashes() == {"/data/a.mp4", "/data/b.mp4", "/data/c.mp4"}


def test_a_listed_file_is_found_however_its_name_is_spelled_and_only_this_runs_videos_count(tmp_path, monkeypatch,
                                                                                              capsys):
    """Names written by hand (relative to the working folder, a trailing space, a CRLF line) and a root spelled
    with ``..`` all name the run's files; a name of no video of the run is not counted."""
    from types import SimpleNamespace

    from datamodules.videoqa import VideoQADataModule, VideoTask

    videos = tmp_path / "bench" / "videos"
    videos.mkdir(parents=True)
    paths = [videos / f"v{i}.mp4" for i in range(5)]
    for p in paths:
        p.write_bytes(b"x")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(tmp_path / "bench")
    (out / DECODE_CRASHES).write_text(f"\n\nvideos/v0.mp4\n{paths[1]}  \r\n{paths[2]}\r\n/elsewhere/x.mp4\n"
                                      f"{tmp_path}/bench/../bench/videos/v3.mp4\n/dam\x00aged\n", encoding="utf-8")
    dm = VideoQADataModule(root=str(tmp_path / "bench"), num_workers=0)
    dm.trainer = SimpleNamespace(global_rank=0, callbacks=[JsonlPredictionWriter(out_dir=str(out))])
    tasks = [VideoTask(p.stem, str(p), "videomme", []) for p in paths]
    assert dm._decode_crashes(tasks) == {str(p) for p in paths[:4]}
    assert "4 videos that ended a decode process before" in capsys.readouterr().out
    # the run's own spelling differs from the file's (its root given with ..): still matched, as the run spells it
    odd = [VideoTask("v1", f"{tmp_path}/bench/../bench/videos/v1.mp4", "videomme", [])]
    assert dm._decode_crashes(odd) == {odd[0].video_path}
    assert dm._decode_crashes([VideoTask("v4", str(paths[4]), "videomme", [])]) == set()


def test_no_path_is_resolved_when_no_file_is_listed(tmp_path, monkeypatch):
    """A run of many videos whose folder lists no crash does no per-video path resolution (a stat per folder of
    each path, slow on a network file system)."""
    from types import SimpleNamespace

    import datamodules.videoqa as vq
    from datamodules.videoqa import VideoQADataModule, VideoTask

    calls = []
    monkeypatch.setattr(vq.os.path, "realpath", lambda p: calls.append(p) or p)
    dm = VideoQADataModule(root=str(tmp_path), num_workers=0)
    dm.trainer = SimpleNamespace(global_rank=0, callbacks=[JsonlPredictionWriter(out_dir=str(tmp_path / "out"))])
    tasks = [VideoTask(f"v{i}", f"/data/v{i}.mp4", "videomme", []) for i in range(1000)]
    assert dm._decode_crashes(tasks) == set() and calls == []
