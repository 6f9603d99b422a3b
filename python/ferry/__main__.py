"""python -m ferry doctor|bench|version: the ferry command of the Python package."""

import sys as _sys

from .cli import main

_sys.exit(main())
