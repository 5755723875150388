import sys

from hfspec.cli import main

sys.exit(main())
