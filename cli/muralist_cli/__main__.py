"""`python -m muralist_cli`: the `muralist` command without its installed script."""

import sys

from muralist_cli import main

sys.exit(main())
