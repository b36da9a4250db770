"""``python -m pipeline.stages.conformance``: one run by hand (pipeline/stages/conformance/stage.py)."""

import sys

from pipeline.stages.conformance.stage import main

sys.exit(main())
