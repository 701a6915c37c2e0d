"""A tiny random Qwen2.5-Omni thinker (+ its feature extractor and video processor) for tests and the demo.

``python -m models.omni.tiny [out_dir, default checkpoints/tiny-omni]`` writes, with ``save_pretrained``:
    config.json + model.safetensors   Qwen2_5OmniThinkerForConditionalGeneration (random, ~10 M parameters,
                                      mostly the real-size 151 936-token vocabulary so a real Qwen tokenizer fits)
    preprocessor_config.json          WhisperFeatureExtractor (128 mel bins, 16 kHz, hop 160: the official settings)
    video_preprocessor_config.json    Qwen2VLVideoProcessor (patch 14, merge 2, temporal patch 2; frames capped at
                                      112x112 pixels so a frame is at most 16 merged tokens)

The thinker keeps every rate of the real model (25 TMRoPE positions per second, 2 s native chunks, audio tower
window ``n_window = 100`` mel frames = 1 s per side, 25 audio tokens per second); only widths and depths are tiny.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import (Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration,
                          WhisperFeatureExtractor)
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

TINY_OMNI_VIDEO_MAX_PIXELS = 112 * 112
TINY_OMNI_VIDEO_MIN_PIXELS = 56 * 56


def tiny_omni_config(hidden: int = 32, num_layers: int = 2) -> Qwen2_5OmniThinkerConfig:
    """The tiny thinker config (hidden ``D = hidden``, ``num_layers`` decoder layers, real token ids)."""
    return Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=2 * hidden,
                          d_model=hidden, n_window=100, max_source_positions=1500, output_dim=hidden),
        vision_config=dict(depth=2, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=2,
                           out_hidden_size=hidden, fullatt_block_indexes=[1], window_size=112, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        text_config=dict(vocab_size=151936, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 1e6},
                         max_position_embeddings=32768),
        position_id_per_seconds=25,
        seconds_per_chunk=2,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )


def build_tiny_omni(out_dir: str | Path, seed: int = 0, hidden: int = 32, num_layers: int = 2) -> Path:
    """Write a tiny random thinker + feature extractor + video processor to ``out_dir`` (created); returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(tiny_omni_config(hidden, num_layers)).eval()
    model.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
                            padding_value=0.0, return_attention_mask=True).save_pretrained(out)
    Qwen2VLVideoProcessor(size={"shortest_edge": TINY_OMNI_VIDEO_MIN_PIXELS,
                                "longest_edge": TINY_OMNI_VIDEO_MAX_PIXELS},
                          patch_size=14, temporal_patch_size=2, merge_size=2).save_pretrained(out)
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "checkpoints/tiny-omni"
    print(build_tiny_omni(target))
