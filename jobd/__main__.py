from jobd.cli.main import main

raise SystemExit(main())
