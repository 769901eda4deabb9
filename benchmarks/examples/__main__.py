from benchmarks.examples.run import main

raise SystemExit(main())
