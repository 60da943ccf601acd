"""python scripts/eval_task.py CKPT: score a checkpoint on the synthetic task it was trained on.

The program is mtp/commands/eval_task.py (installed as mtp-eval-task too); --help lists its arguments.
"""

from mtp.commands.eval_task import entry_point

if __name__ == "__main__":
    entry_point()
