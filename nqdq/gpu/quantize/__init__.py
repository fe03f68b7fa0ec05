"""quantize / dequantize on the GPU: the plan (``plan``: which kernels a shape and scheme
take, and their launches) and one file per kernel family: the general element kernels
(``general``), last-axis rows and groups (``lastaxis``), 2-D tiles (``tiles``), per-channel
scales (``columns``, ``column_ring``, ``column_cluster``), one-launch per-tensor scales
(``grid``, ``tensor_resident``) and dequantize's plan (``dequant_plan``)."""
