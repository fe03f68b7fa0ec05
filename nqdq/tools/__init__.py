"""Tools built on the library, not part of it: the ``nqdq`` command (``cli``), its report
(``report``), checkpoint reading (``tensorfile``) and the PTX audit (``ptx_audit``)."""
