"""``python -m rocmft.worker RUN_DIR`` (one process) or ``torchrun ... -m rocmft.worker RUN_DIR`` (one per rank)."""

import sys

from rocmft.worker.main import main

raise SystemExit(main(sys.argv[1]))
