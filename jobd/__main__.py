from jobd.cli import main

raise SystemExit(main())
