"""``python -m benchmarks.multi_turn``: see benchmarks/multi_turn/run.py."""

from benchmarks.multi_turn.run import main

raise SystemExit(main())
