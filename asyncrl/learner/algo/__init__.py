"""The learner's math: pure functions on tensors, and the config wiring that picks them.

losses        policy losses by name (``POLICY_LOSSES``), one ``LossInputs`` record in
advantages    advantage estimators and reward shaping
aggregation   token aggregation, masked statistics, KL estimators
targets       rewards -> per-token advantages (and critic returns) for one step
truncation    completions cut at the length limit: kept, masked or penalized
stale_tokens  stale tokens, per token (``algorithm.stale_tokens``)
"""
