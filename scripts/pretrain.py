"""python scripts/pretrain.py: pretrain an MTP model.

The program is mtp/commands/pretrain.py (installed as mtp-pretrain too); --help lists its arguments.
"""

from mtp.commands.pretrain import entry_point

if __name__ == "__main__":
    entry_point()
