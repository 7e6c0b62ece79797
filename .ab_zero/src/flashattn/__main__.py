"""``python -m flashattn bench|check|info``: see :mod:`flashattn.cli`."""
import sys

from flashattn.cli import main

sys.exit(main())
