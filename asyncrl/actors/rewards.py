"""The built-in reward functions, under the names ``task.reward_fn`` specs give them
(``asyncrl.actors.rewards:math_reward``, docs/rewards.md):

- ``math_reward`` and ``math_answer_reward`` (actors/math_reward.py);
- ``python_code_reward``, sandboxed (actors/code_reward.py);
- the demo's ``addition_reward`` lives with its task in actors/addition.py.

How a reward function is loaded and which conventions it may follow: actors/reward_loading.py;
how it is called (failures score 0 with a reason): actors/reward_calls.py; where, with a
deadline: actors/scoring.py.
"""

from asyncrl.actors.code_reward import python_code_reward
from asyncrl.actors.math_reward import extract_final_answer, math_answer_reward, math_reward

__all__ = ["extract_final_answer", "math_answer_reward", "math_reward", "python_code_reward"]
