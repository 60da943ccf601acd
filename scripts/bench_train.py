"""python scripts/bench_train.py: the training-step benchmark (memory and time, sequential vs naive loss).

The program is mtp/commands/bench_train.py (installed as mtp-bench-train too); --help lists its arguments.
"""

from mtp.commands.bench_train import entry_point

if __name__ == "__main__":
    entry_point()
