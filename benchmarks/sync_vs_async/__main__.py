"""``python -m benchmarks.sync_vs_async``: see benchmarks/sync_vs_async/run.py."""

from benchmarks.sync_vs_async.run import main

raise SystemExit(main())
