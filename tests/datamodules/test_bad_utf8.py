"""Issue 35 §3: invalid UTF-8 inside a Video-MME parquet ``string`` column is an AnnotationError naming the file, the
row and the field (pyarrow's own ``UnicodeDecodeError`` from ``to_pylist()`` names neither)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamodules.benchmarks import AnnotationError, load_benchmark

ROW = {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "History", "url": "",
       "videoID": "v1", "question_id": "001-1", "task_type": "Counting Problem", "question": "How many dogs?",
       "answer": "B"}
OPTIONS = ["A. one", "B. two", "C. three"]


def _strings(values: list[bytes]) -> pa.Array:
    """A pyarrow ``string`` array holding exactly these bytes (invalid UTF-8 included: an unchecked cast)."""
    return pa.array(values, pa.binary()).cast(pa.string(), safe=False)


def _write(path, bad_field: str, bad: bytes, row: int = 2, n: int = 4):
    cols = {}
    for k, v in ROW.items():
        vals = [(f"001-{i + 1}" if k == "question_id" else v).encode() for i in range(n)]
        if k == bad_field:
            vals[row] = bad
        cols[k] = _strings(vals)
    opts = [list(OPTIONS) for _ in range(n)]
    offsets = pa.array([3 * i for i in range(n + 1)], pa.int32())
    flat = [o.encode() for r in opts for o in r]
    if bad_field == "options":
        flat[3 * row + 1] = bad
    cols["options"] = pa.ListArray.from_arrays(offsets, _strings(flat))
    pq.write_table(pa.table(cols), path)
    return path


@pytest.mark.parametrize("field, bad", [("question", b"caf\xe9 au lait?"), ("options", b"B. \xff\xfe"),
                                        ("task_type", b"\xc3(")])
def test_invalid_utf8_in_a_string_cell_names_file_row_and_field(tmp_path, field, bad):
    f = _write(tmp_path / "test-00000-of-00001.parquet", field, bad)
    with pytest.raises(pa.ArrowInvalid):   # the table holds bytes that are not UTF-8 (the case is real)
        pq.read_table(f).column(field).validate(full=True)
    with pytest.raises(AnnotationError) as e:
        load_benchmark("videomme", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{f} row 2 (question_id='001-3'): {field} is not valid UTF-8 text (")
    assert "at byte" in msg


def test_invalid_utf8_in_the_question_id_itself(tmp_path):
    f = _write(tmp_path / "test-00000-of-00001.parquet", "question_id", b"001-\x80", row=1)
    with pytest.raises(AnnotationError, match=rf"^{f} row 1 \(question_id='<not UTF-8>'\): question_id is not valid "
                                              r"UTF-8 text \(invalid start byte at byte 4\)$"):
        load_benchmark("videomme", tmp_path)
