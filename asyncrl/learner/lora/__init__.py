"""Low-rank adapters on the learner's policy (``model.lora``; docs/models.md, "LoRA").

adapters  add peft's LoRA layers to a loaded model, freeze the rest (``add_adapters``)
merge     the merged weights under the model's own names, for weight syncs and exports
"""
