from dgchat.cli import main

raise SystemExit(main())
