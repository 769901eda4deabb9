"""What runs on every learner rank: the model, its batches and one training step.

step           one step: no-grad forwards -> advantages -> PPO updates
model          load a Hugging Face causal LM, shard it with FSDP2, full weights
sharded_load   no rank ever holds the full model
reference      the frozen reference policy for the KL term
critic         the value model for PPO with GAE
logprobs       token log-probs and entropy, a chunk of positions at a time
batch          groups -> padded tensors, scattered between ranks
micro_batches  which rows run together in one forward/backward
packing        packed micro-batches (no padding)
finite         NaN/inf never reaches the weights, the actors or a checkpoint
device         where the learner computes and the process group it joins
"""
