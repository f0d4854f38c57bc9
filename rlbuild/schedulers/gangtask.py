"""`python -m rlbuild.schedulers.gangtask [options] -- <job step>`: what every task of a gang runs. It finds the
scheduler whose task this process is (from its variables) and hands it to the gang bootstrap (rlbuild/job/gang.py),
which takes rank, attempt, ports and address from it."""

from __future__ import annotations

import os
import sys

from rlbuild.job import gang
from rlbuild.schedulers.registry import task_scheduler


def main() -> int:
    gang.listen_for_warning()  # before anything slow (gang.listen_for_warning says why)
    return gang.main(sys.argv[1:], task_scheduler(os.environ))


if __name__ == "__main__":
    raise SystemExit(main())
