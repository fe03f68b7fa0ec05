"""``python -m nqdq``: the same command as the ``nqdq`` console script (``nqdq.cli``)."""

from .cli import main

raise SystemExit(main())
