"""The built-in reward functions, under the names ``task.reward_fn`` specs give them
(``asyncrl.actors.rewards:math_reward``, docs/rewards.md):

- ``math_reward`` and ``math_answer_reward`` (actors/rewards/math_reward.py);
- ``python_code_reward``, sandboxed (actors/rewards/code_reward.py);
- the demo's ``addition_reward`` lives with its task in actors/data/addition.py.

How a reward function is loaded and which conventions it may follow: actors/rewards/loading.py;
how it is called (failures score 0 with a reason): actors/rewards/calls.py; where, with a
deadline: actors/rewards/scoring.py.
"""

from asyncrl.actors.rewards.code_reward import python_code_reward
from asyncrl.actors.rewards.math_reward import extract_final_answer, math_answer_reward, math_reward

__all__ = ["extract_final_answer", "math_answer_reward", "math_reward", "python_code_reward"]
