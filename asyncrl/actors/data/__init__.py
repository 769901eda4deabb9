"""The prompts an actor samples from: the demo task, dataset files, and the prompt record.

prompt       ``Prompt``: one task instance, as every source yields it
tasks        the prompt sources (``task.name``): deterministic, indexable streams
addition     the demo task: addition prompts and their reward
file_source  the ``file`` task: dataset rows, formatted, length-filtered, in seeded epochs
datafile     reading parquet / JSON Lines rows, checking every key the config names
identity     what the buffer's prompt cursors depend on; a restarted actor must agree
"""
