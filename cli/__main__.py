"""`python -m cli ARGS...` is `attnzoo ARGS...`."""

import sys

from .entry import main

sys.exit(main())
