"""Loading an original-layout checkpoint prints no transformers "model of type `videollama3_qwen2` to instantiate a
model of type ``" warning (issue 43 item 5: a7fdaaf printed it on every such load), while other config warnings
still get through."""
import logging

from models.videollama3.convert import read_original
from models.videollama3.original_layout import write_original_layout


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_original_layout_load_has_no_model_type_warning(tiny_vl3_dir, tmp_path):
    orig = write_original_layout(tiny_vl3_dir, tmp_path / "orig")
    logger = logging.getLogger("transformers.configuration_utils")
    keep = _Keep()
    logger.addHandler(keep)          # after the logger's filters: what its own handlers would print
    try:
        read_original(orig)
        logger.warning("another config warning")
    finally:
        logger.removeHandler(keep)
    assert not [m for m in keep.messages if "to instantiate a model of type" in m]
    assert "another config warning" in keep.messages
