"""The core layer: types, config, wire formats, transports and process helpers that every
other part of asyncrl imports (docs/architecture.md, "Code layers"). It imports nothing of
asyncrl's buffer, roles or orchestration."""
