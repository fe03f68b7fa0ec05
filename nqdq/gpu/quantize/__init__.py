"""quantize / dequantize on the GPU: the plan (``plan``: a call's launches, built once and
cached; ``rules``: which kernels a shape and scheme take, as an ordered table; ``choices``:
the kernel designs a case may choose between; ``slots``, ``runners``, ``params``: a plan's
arrays, its generated GPU runners, the kernels' parameters) and one file per kernel family: the general element kernels
(``general``), last-axis rows and groups (``lastaxis``), 2-D tiles (``tiles``), per-channel
scales (``columns``, ``column_ring``, ``column_cluster``), one-launch per-tensor scales
(``grid``, ``tensor_resident``) and dequantize's plan (``dequant_plan``)."""
