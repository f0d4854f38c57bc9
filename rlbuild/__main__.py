import sys

from rlbuild.cli import main

sys.exit(main())
