"""Heads on a pretrained model: starting from a checkpoint (:mod:`~mtp.pretrained.init_from`), self-distillation,
online heads, the offline reference model, and exporting as a Hugging Face directory."""
