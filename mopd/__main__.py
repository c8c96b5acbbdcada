import sys

from mopd.cli import main

sys.exit(main())
