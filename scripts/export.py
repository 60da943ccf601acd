"""python scripts/export.py: export a checkpoint as a Hugging Face Llama directory.

The program is mtp/commands/export.py (installed as mtp-export too); --help lists its arguments.
"""

from mtp.commands.export import entry_point

if __name__ == "__main__":
    entry_point()
