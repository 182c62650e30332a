"""``python -m tinyserve.cli``: how the launcher starts its children."""

import sys

from tinyserve.cli import main

sys.exit(main())
