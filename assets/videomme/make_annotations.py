"""Writes the demo's Video-MME-format annotation file (``videomme/test-demo.parquet``), hand-written questions
over the two bundled public-domain videos (see ``assets/media/README.md``). Videos: ``assets/media/<videoID>.mp4`` (loader ``video_dir="media"`` with root ``assets``). Run: ``python assets/videomme/make_annotations.py``."""
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROWS = [
    # video_id, duration, domain, sub_category, url, videoID, question_id, task_type, question, options, answer
    ("001", "short", "Life Record", "Pet & Animal", "", "cockatoo", "001-1", "Object Recognition",
     "What animal is shown on the perch?", ["A. A dog.", "B. A cockatoo.", "C. A cat.", "D. A goldfish."], "B"),
    ("001", "short", "Life Record", "Pet & Animal", "", "cockatoo", "001-2", "Attribute Perception",
     "What colour are most of the bird's feathers?", ["A. White and pale pink.", "B. Bright green.",
                                                      "C. Black.", "D. Deep blue."], "A"),
    ("001", "short", "Life Record", "Pet & Animal", "", "cockatoo", "001-3", "Spatial Perception",
     "What is behind the bird?", ["A. A beach.", "B. A snowy mountain.", "C. Windows and a wall.",
                                  "D. A crowd of people."], "C"),
    ("001", "short", "Life Record", "Pet & Animal", "", "cockatoo", "001-4", "Temporal Perception",
     "About how long is the video?", ["A. About 14 seconds.", "B. About 2 minutes.", "C. About 10 minutes.",
                                      "D. About 1 hour."], "A"),
    ("002", "short", "Life Record", "Daily Life", "", "realshort", "002-1", "Object Recognition",
     "Which plant stands in a round pot on the window sill?", ["A. A cactus.", "B. A small tree.",
                                                               "C. A sunflower.", "D. A palm."], "B"),
    ("002", "short", "Life Record", "Daily Life", "", "realshort", "002-2", "Object Recognition",
     "What lies on the desk in front of the window?", ["A. A laptop.", "B. A stack of papers.",
                                                        "C. A cat.", "D. A bicycle."], "B"),
    ("002", "short", "Life Record", "Daily Life", "", "realshort", "002-3", "Attribute Perception",
     "What colour is the small cup on the right window sill?", ["A. Green.", "B. Red.", "C. Black.",
                                                                 "D. Purple."], "A"),
]
COLS = ["video_id", "duration", "domain", "sub_category", "url", "videoID", "question_id", "task_type", "question",
        "options", "answer"]

if __name__ == "__main__":
    out = Path(__file__).parent / "test-demo.parquet"
    out.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({c: [r[i] for r in ROWS] for i, c in enumerate(COLS)}), out)
    print(f"wrote {len(ROWS)} questions to {out}")
