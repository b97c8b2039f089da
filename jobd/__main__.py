"""``python -m jobd``: the command line (``jobd.cli.main``)."""

from jobd.cli.main import main

raise SystemExit(main())
