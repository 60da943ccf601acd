"""Training: the losses, the LightningModule, its callbacks, metrics, optimizer and parallelism, the trunk cache,
and ``train(cfg)`` (:mod:`~mtp.training.train`), which builds them all from the Hydra config."""
