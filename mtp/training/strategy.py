"""Lightning's ModelParallelStrategy as mtp uses it: a 2-D mesh of FSDP2 (data parallel) by tensor parallelism."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy

from mtp.errors import UserError
from mtp.training.parallel import TP_SETTING


class MeshStrategy(ModelParallelStrategy):
    """ModelParallelStrategy whose device mesh is ``(world_size / tensor_parallel_size, tensor_parallel_size)``: every
    process in one data-parallel group with ``tensor_parallel_size=1`` (``trainer=fsdp``), tensor-parallel groups of
    that many processes otherwise (``trainer=tp``), and the data-parallel groups across them.

    Lightning's own default (``"auto"``) makes every node one tensor-parallel group; here the tensor-parallel size is
    what the config says and the data-parallel size follows from the processes (devices x nodes). The module splits
    over ``self.device_mesh["tensor_parallel"]`` and shards over ``self.device_mesh["data_parallel"]``
    (:meth:`mtp.training.lit.MTPLitModule.configure_model`).
    """

    def __init__(self, tensor_parallel_size: int = 1, **kwargs: Any) -> None:
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise UserError(f"{TP_SETTING}={tensor_parallel_size} must be a whole number of processes, at least 1.")
        super().__init__(data_parallel_size="auto", tensor_parallel_size=tensor_parallel_size, **kwargs)

    @property
    def tensor_parallel_size(self) -> int:
        return self._tensor_parallel_size

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # known only now: devices x nodes
            processes, tp = self.world_size, self._tensor_parallel_size
            if processes % tp:
                raise UserError(
                    f"{TP_SETTING}={tp} does not divide the {processes} processes (trainer.devices x "
                    "trainer.num_nodes); use a number of processes that it divides."
                )
            self._data_parallel_size = processes // tp
        super().setup_environment()
