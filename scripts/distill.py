"""python scripts/distill.py: self-distillation data, a model's own continuations of prompts, to train heads on.

The program is mtp/commands/distill.py (installed as mtp-distill too); --help lists its arguments.
"""

from mtp.commands.distill import entry_point

if __name__ == "__main__":
    entry_point()
