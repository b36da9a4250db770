"""``python -m pipeline.conformance``: one run by hand (pipeline/conformance/stage.py)."""

import sys

from .stage import main

sys.exit(main())
