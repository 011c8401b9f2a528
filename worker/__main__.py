"""`python -m worker ...`: see worker.cli for the flags."""

from worker.cli import main

raise SystemExit(main())
