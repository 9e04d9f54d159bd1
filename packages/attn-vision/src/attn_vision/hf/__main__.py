"""``python -m attn_vision.hf --coverage``."""

import sys

from . import main

sys.exit(main())
