"""The int8 and int4 kernels PyTorch has on CPU against the float32 products the decoder runs, at a decoding step's
shapes (:mod:`mtp.benchmarks.int8_kernels`): the measurement that chose :mod:`mtp.decode.int8`'s kernels and
:mod:`mtp.decode.quantize`'s.

    python -m mtp.commands.int8_kernels [--rows 1,3,8,32] [--threads 1] [--shapes default|smollm2|all]

Prints microseconds per call and each candidate's error (norm of the difference from float32's product over its
norm), a line per shape and row count.
"""

from __future__ import annotations

import argparse

import torch

from mtp.benchmarks.int8_kernels import SHAPES, measure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,3,8,32", help="rows of x, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fewest stalls on a shared machine)")
    parser.add_argument("--shapes", choices=["default", "smollm2", "all"], default="all")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = SHAPES["default"] + SHAPES["smollm2"] if args.shapes == "all" else SHAPES[args.shapes]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); microseconds per call (error)")
    for label, inputs, outputs in shapes:
        for rows in (int(r) for r in args.rows.split(",")):
            results = measure(inputs, outputs, rows)
            cells = ", ".join(f"{name} {us:,.0f} ({error:.1e})" for name, (us, error) in results.items())
            print(f"{label}, {rows} row(s): {cells}", flush=True)


if __name__ == "__main__":
    main()
