"""``python -m runledger``: the ``runledger`` program."""

import sys

from runledger.cli import main

sys.exit(main())
