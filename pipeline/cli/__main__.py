"""``python -m pipeline.cli``: the ``ggufpipe`` command."""

import sys

from pipeline.cli import main

sys.exit(main())
