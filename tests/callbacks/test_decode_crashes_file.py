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
