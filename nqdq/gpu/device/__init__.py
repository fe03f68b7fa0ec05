"""Device functions, the GPU twins of ``nqdq.reference``: element codes (``codec``), scales
(``scales``), exact division (``division``) and 16-byte units of codes (``elements``)."""
