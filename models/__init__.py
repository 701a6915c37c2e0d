"""Model code, the only package importing transformers: the VideoLLaMA3 family (``models.videollama3``), the
Qwen2.5-Omni family (``models.omni``), and what both share (``kernels``, ``fused_forwards``, ``vision_attention``,
``tokenizer``, ``loading``, ``heads``)."""
