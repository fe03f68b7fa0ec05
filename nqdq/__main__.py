"""``python -m nqdq``: the same command as the ``nqdq`` console script (``nqdq.tools.cli``)."""

from .tools.cli import main

raise SystemExit(main())
