"""quantize / dequantize on the GPU.

The plan: ``plan`` (``QuantPlan``: a call's launches, built once per shape and scheme and
cached; ``quantize`` / ``dequantize``), ``rules`` (which kernels a case takes: an ordered
table, first match wins), ``choices`` (the kernel designs a case may choose between, and
why), ``slots`` / ``params`` / ``runners`` (a plan's arrays, the kernels' parameters, its
generated CuPy / PyTorch runners), ``dequant_plan`` (dequantize's hot path).

The kernel families, one file each:

==================  ==================================================================
``lastaxis``        last-axis rows and groups (per token, 1xG, MX, NVFP4, int groups,
                    asymmetric / centred), built from 16-byte units: ``units``,
                    ``reductions``, ``encoders``, ``pair_encoders``, ``sr_units``,
                    ``asym_units``, ``group_chunks``, ``stat_chunks``; ``unrolled``
                    generates their per-unit source (and says why)
``tiles``           128x128 (B0 x B1) tile scales
``general``         the general element kernels (any axis, layout or shape)
``columns``         per-channel scales: two passes, or one block a stripe
``column_ring``     per-channel scales through a shared-memory ring (no clusters)
``column_cluster``  per-channel scales by thread-block clusters (sm_90+)
``grid``            one-launch per-tensor and NVFP4 scales at decode sizes
``tensor_resident`` dynamic per-tensor scales in one cooperative launch
``dequant_kernels`` dequantize
==================  ==================================================================
"""
