"""python scripts/decode.py: decode from a checkpoint, autoregressively or self-speculatively.

The program is mtp/commands/decode.py (installed as mtp-decode too); --help lists its arguments.
"""

from mtp.commands.decode import entry_point

if __name__ == "__main__":
    entry_point()
