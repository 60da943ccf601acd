"""python scripts/gpu_check.py: the GPU check kit.

The program is mtp/commands/gpu_check.py; --help lists its arguments.
"""

from mtp.commands.gpu_check import entry_point

if __name__ == "__main__":
    entry_point()
