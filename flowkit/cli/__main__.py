"""``python -m flowkit.cli``: the ``flowkit`` command."""

import sys

from . import main

sys.exit(main())
