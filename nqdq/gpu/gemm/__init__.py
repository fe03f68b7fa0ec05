"""GEMMs on quantized operands: the plan and launches (``plan``), the ``mma.sync`` kernel
(``mma_sync``) and the sm_90a warpgroup kernel (``wgmma``)."""
