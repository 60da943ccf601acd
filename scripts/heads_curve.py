"""python scripts/heads_curve.py BENCH_DIR ... --out DIR: what more distilled data and training time buy, as a curve.

The program is mtp/commands/heads_curve.py; --help lists its arguments.
"""

from mtp.commands.heads_curve import entry_point

if __name__ == "__main__":
    entry_point()
