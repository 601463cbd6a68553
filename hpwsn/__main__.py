"""`python -m hpwsn ...`: the command-line client (see hpwsn.cli)."""

from hpwsn.cli import main

raise SystemExit(main())
