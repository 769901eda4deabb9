"""``model.path`` before anything starts: found, checked, and warned about.

source     where ``model.path`` points, turned into a local Hugging Face directory
directory  a model directory checked as one unit (config, weights, tokenizer)
advice     warnings for settings far outside what a pretrained model tolerates
"""
