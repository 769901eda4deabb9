"""``python -m benchmarks.vs_trl``: see benchmarks/vs_trl/run.py."""

from benchmarks.vs_trl.run import main

raise SystemExit(main())
