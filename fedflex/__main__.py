"""``python -m fedflex``: the ``fedflex`` command (:mod:`fedflex.launch.cli`)."""

import sys

from fedflex.launch.cli import main

sys.exit(main())
