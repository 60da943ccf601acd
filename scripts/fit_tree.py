"""python scripts/fit_tree.py: fit a draft tree to a checkpoint.

The program is mtp/commands/fit_tree.py (installed as mtp-fit-tree too); --help lists its arguments.
"""

from mtp.commands.fit_tree import entry_point

if __name__ == "__main__":
    entry_point()
