import sys

from muralist_cli import main

sys.exit(main())
