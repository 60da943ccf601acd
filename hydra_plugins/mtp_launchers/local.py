"""``hydra/launcher=local``: every job of a sweep in a process of its own on this machine, at most ``max_parallel``
at once, through Hydra's submitit launcher (its local executor; the ``cluster`` extra installs it).

The submitit plugin starts every job of a sweep at once; this launcher hands it the jobs ``max_parallel`` at a time
and waits for each group before the next, so that a sweep of many runs fits the cores and memory of one machine. A job
that fails stops the sweep after its group; running the same command again continues it (finished jobs are skipped,
the others resume from their last.ckpt: mtp.commands.pretrain.continue_sweep_job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher as SubmititLocalLauncher
except ImportError:  # the cluster extra is not installed: mtp's pretrain command says so before Hydra starts
    SubmititLocalLauncher = None

if SubmititLocalLauncher is not None:

    class LocalLauncher(SubmititLocalLauncher):
        """submitit's local executor, at most ``max_parallel`` jobs at once."""

        def __init__(self, max_parallel: int = 1, **params: Any) -> None:
            if not isinstance(max_parallel, int) or max_parallel < 1:
                from mtp.errors import UserError  # the library's errors: imported with the launcher, not at scan

                raise UserError(f"hydra.launcher.max_parallel={max_parallel} must be a whole number, at least 1.")
            super().__init__(**params)
            self.max_parallel = max_parallel

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            returns: list[JobReturn] = []
            for first in range(0, len(job_overrides), self.max_parallel):
                group = job_overrides[first : first + self.max_parallel]
                returns += super().launch(group, initial_job_idx + first)
            return returns
