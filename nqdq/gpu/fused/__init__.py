"""The fused ops (norms, activations, MoE gather / scatter with quantization) on the GPU:
the row kernel's launchers and plans (``plan``), the MoE sort's (``moe``), the row kernels
(``rows``) and the shared device code (``kernels``)."""
