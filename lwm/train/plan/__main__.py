from lwm.train.plan.command import main

raise SystemExit(main())
