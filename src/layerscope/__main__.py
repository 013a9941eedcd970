"""``python -m layerscope`` runs the command-line interface."""

import sys

from layerscope.cli import main

sys.exit(main())
