"""The fused ops (norms, activations, MoE gather / scatter with quantization) on the GPU:
the plans (``plan``), the row kernels (``rows``) and the shared device code (``kernels``)."""
