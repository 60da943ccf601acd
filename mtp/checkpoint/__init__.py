"""Checkpoints: mtp's format (:mod:`~mtp.checkpoint.format`), the one loader of every checkpoint mtp reads
(:mod:`~mtp.checkpoint.load`) and writing them whole (:mod:`~mtp.checkpoint.save`)."""
