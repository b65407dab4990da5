"""`python -m muralist_runtime --spec FILE` (what torchrun / accelerate launch start)."""

import sys

from .main import main

sys.exit(main())
