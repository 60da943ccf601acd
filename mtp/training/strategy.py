"""Lightning's ModelParallelStrategy as mtp uses it: FSDP2 over every process, no tensor parallelism."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy


class FullyShardedStrategy(ModelParallelStrategy):
    """ModelParallelStrategy whose device mesh puts every process in one data-parallel group: ``(world_size, 1)``.

    Lightning's default mesh splits the processes of a node into a tensor-parallel group (``"auto"``), which mtp does
    not use; with this strategy the module shards over ``self.device_mesh["data_parallel"]`` (``trainer=fsdp``).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, **kwargs)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # known only now: devices x nodes
            self._data_parallel_size = self.world_size
        super().setup_environment()
