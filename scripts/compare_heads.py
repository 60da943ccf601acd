"""python scripts/compare_heads.py: compare head types side by side.

The program is mtp/commands/compare_heads.py (installed as mtp-compare-heads too); --help lists its arguments.
"""

from mtp.commands.compare_heads import entry_point

if __name__ == "__main__":
    entry_point()
