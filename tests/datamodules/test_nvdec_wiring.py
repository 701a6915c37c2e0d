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


def test_strict_frames_reads_every_file_on_the_cpu(tmp_path, monkeypatch):
    """``strict_frames`` needs the decoder's concealment flags, which NVDEC's frames lack (issue 42 item 1): with
    ``decoder: auto`` (and ``nvdec`` at this level) every file is read by the CPU reader, which applies the rule
    (``corrupt_middle``: an error, or frames 1 and 2 replaced, as in test_bad_media.py), and the record says why;
    NVDEC is never asked."""
    from datamodules.decode import DecodeError, video
    from tests.media_factory import MediaFactory

    def never(*a, **k):
        raise AssertionError("NVDEC read under strict_frames")

    monkeypatch.setattr(nvdec, "read_nvdec", never)
    monkeypatch.setattr(nvdec.reader, "supports", lambda probe, path: None)
    media = MediaFactory(tmp_path)
    path = media.get("corrupt_middle")
    with pytest.raises(DecodeError, match=r"decoding 4 frames failed \(corrupted or truncated stream"):
        decode_video(path, 1024, decoder="auto", strict_frames=True)
    dec = decode_video(path, 1024, decoder="auto", strict_frames=True, max_replaced_frac=0.5)
    assert dec.info["frames_replaced"] == [1, 2] and dec.info["decoder"] == "pyav_skip"
    assert dec.info["decoder_fallback"] == video.NVDEC_UNCHECKED and "concealment_checked" not in dec.info
    good = decode_video(media.get("good"), 1024, decoder="nvdec", strict_frames=True)
    assert good.info["decoder"] == "pyav_skip" and good.info["decoder_fallback"] == video.NVDEC_UNCHECKED


def test_strict_frames_with_decoder_nvdec_stops_the_run_before_it_writes(tmp_path):
    """A run asking for every video on NVDEC and for the strict rule cannot have both: one line at construction,
    naming the settings and the way out; ``auto`` is accepted (it reads on the CPU then)."""
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    with pytest.raises(SettingError, match=r"data.strict_frames=true needs the decoder's concealment flags, which "
                                           r"frames decoded by NVDEC lack .*use data.decoder cpu"):
        VideoQADataModule(root=str(tmp_path), decoder="nvdec", strict_frames=True)
    assert VideoQADataModule(root=str(tmp_path), decoder="auto", strict_frames=True).decoder == "auto"
