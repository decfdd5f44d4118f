"""``python -m runledger``: the ``runledger`` program. Importing this module only defines it."""

import sys

from runledger.cli import main

if __name__ == "__main__":
    sys.exit(main())
