"""``python -m finetune`` runs the ``finetune`` command."""

import sys

from .cli import main

sys.exit(main())
