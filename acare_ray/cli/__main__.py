"""``python -m acare_ray.cli ...``: the ``acare`` command without its console script."""

import sys

from acare_ray.cli import main

sys.exit(main())
