"""python scripts/bench_decode.py: the decoding benchmark.

The program is mtp/commands/bench_decode.py (installed as mtp-bench-decode too); --help lists its arguments.
"""

from mtp.commands.bench_decode import entry_point

if __name__ == "__main__":
    entry_point()
