"""python scripts/results_page.py RESULTS.json --out docs/results/NAME.md: a benchmark's output as a results page.

The program is mtp/commands/results_page.py; --help lists its arguments.
"""

from mtp.commands.results_page import entry_point

if __name__ == "__main__":
    entry_point()
