"""``asyncrl eval``: score a model or a learner checkpoint on the validation prompts with the
task's reward, without a learner, a buffer or Redis (command.py reads top to bottom).

    asyncrl eval [--checkpoint PATH] [--output FILE] [overrides]
     │ args.py        the run's Hydra config; data.val_files stand in for data.train_files
     │ checkpoint.py  --checkpoint: a step_<V> directory, its hf/ export or a run directory
     │                (its newest complete checkpoint) -> the hf/ export and version V, or
     │                a LoRA run's adapter/ (loaded on model.path, its base checked)
     │ inputs.py      reward fn, episode env/tools, model directory, validation prompts
     │                (launch/preflight.py's checks; nothing is started before they pass)
     │ session.py     one vLLM engine (actors/engine/), no weight sync; a LoRA adapter
     │                served as an actor serves one (actors/engine/adapters.py)
     │ scoring.py     eval.prompts_in_flight prompts at once through actors/validation.py's
     │                Validator.score_prompt (n samples, reward pool, multi-turn episodes);
     │                progress and the eval.timeout_s deadline; Ctrl-C/SIGTERM stops it
     │ result.py      learner/hub/validation.py's summarize (unbiased pass@k) -> eval.json
     ▼                and the console summary

Exit codes: 0 every prompt scored; 1 an input is missing or wrong (nothing scored), the
deadline passed (the prompts scored so far are written, ``complete`` false) or the reward
failed too often (``task.max_reward_error_frac``); 130 interrupted (partial result written).
"""
