"""``python -m rocmft`` is the ``rocmft`` command."""

from rocmft.cli import main

raise SystemExit(main())
