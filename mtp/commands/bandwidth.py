"""How fast this machine reads memory with the decoder's threads (:mod:`mtp.benchmarks.bandwidth`): the read bandwidth
that limits a batch-1 decoding step on a CPU.

    python -m mtp.commands.bandwidth [--megabytes 540] [--threads 2] [--rounds 7]

Prints the best round's bytes per second of a sum and of a matrix-vector product over the buffer.
"""

from __future__ import annotations

import argparse

from mtp.benchmarks.bandwidth import read_bandwidth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=540.0, help="the buffer read (default: SmolLM2's fp32)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    measured = read_bandwidth(int(args.megabytes * 2**20), args.threads, args.rounds)
    print(
        f"read bandwidth with {measured.threads} thread(s) over {measured.megabytes:.0f} MB: sum "
        f"{measured.sum_bytes_per_s / 1e9:.1f} GB/s, matrix-vector {measured.mv_bytes_per_s / 1e9:.1f} GB/s"
    )


if __name__ == "__main__":
    main()
