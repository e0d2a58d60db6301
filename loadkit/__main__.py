from loadkit.cli import main

raise SystemExit(main())
