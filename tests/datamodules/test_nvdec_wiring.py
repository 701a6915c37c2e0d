"""``data.decoder`` reaches the NVDEC reader of ``datamodules/decode/nvdec.py`` through ``decode.READERS`` (CPU: the
reader's decisions; the frames themselves are checked on the GPU in test_nvdec.py)."""
import numpy as np
import pytest

from datamodules import decode
from datamodules.decode import decode_video, nvdec


def test_importing_nvdec_registers_its_reader():
    assert decode.READERS["nvdec"] is nvdec.reader
    assert nvdec.reader.whole_video and callable(nvdec.reader.supports)


def test_auto_without_a_gpu_goes_to_the_cpu_per_file_with_the_reason(tmp_path):
    from tests.media_factory import MediaFactory

    path = MediaFactory(tmp_path).get("good")
    dec = decode_video(path, 1024, decoder="auto")
    assert dec.info["decoder"] in ("pyav_skip", "decord")
    assert dec.info["decoder_fallback"] == nvdec.nvdec_unsupported(path)   # here: no CUDA device (or no NVDEC)


def test_a_run_time_nvdec_failure_reads_the_file_on_the_cpu(tmp_path, monkeypatch):
    """The reader's fallback: NVDEC raising on a file it was expected to decode gives the CPU reader's frames,
    recorded as ``decoder`` (the CPU reader) and ``decoder_fallback`` (NVDEC's message)."""
    from tests.media_factory import MediaFactory

    path = MediaFactory(tmp_path).get("good")

    def failing(path, idx, hw, gpu_id=0):
        raise nvdec.NvdecError(f"{path}: NVDEC decoding failed (test)")

    monkeypatch.setattr(nvdec, "read_nvdec", failing)
    monkeypatch.setattr(nvdec.reader, "supports", lambda probe, path: None)
    dec = decode_video(path, 1024, decoder="nvdec")
    ref = decode_video(path, 1024)
    assert np.array_equal(dec.frames.numpy(), ref.frames.numpy())
    assert dec.info["decoder"] == ref.info["decoder"] and "NVDEC decoding failed (test)" in dec.info["decoder_fallback"]


def test_decoder_nvdec_without_nvdec_stops_the_run_before_it_writes(tmp_path):
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    if nvdec.available() is None:
        pytest.skip("NVDEC is usable here")
    with pytest.raises(SettingError, match="decoder=nvdec: .*use decoder cpu"):
        VideoQADataModule(root=str(tmp_path), decoder="nvdec").setup("predict")
