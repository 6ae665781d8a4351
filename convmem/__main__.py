"""``python -m convmem``: the ``convmem`` command."""

import sys

from convmem.cli import main

sys.exit(main())
