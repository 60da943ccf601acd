"""mtp's Hydra launchers (a Hydra plugin package: Hydra runs only launchers defined under ``hydra_plugins``)."""
