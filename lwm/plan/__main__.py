from lwm.plan.command import main

raise SystemExit(main())
