"""Rank 0's I/O for the learner loop (``LearnerHub`` is the protocol the loop holds).

protocol        ``LearnerHub``: every call the loop makes on its hub
hub             ``Hub``: the feed, the publisher and the recorder, composed
null            ``NullHub``: the same calls on the other ranks, answered neutrally
feed, data      each step's groups from the buffer; stale ones dropped and counted
validation      when to validate; the ``val/*`` metrics
recorder        where the time goes, the step records, totals, the ledger watch
runlog          console line, ``metrics.jsonl``, ``summary.json``, ``reward.png``
totals          the run's totals, carried by every checkpoint
reward_records  what a sample's reward fields say, summed
"""
