"""Self-distillation data: a model's own continuations of prompts, to train draft heads on (python
scripts/distill.py, or mtp-distill once installed: the same arguments).

    python scripts/distill.py MODEL --out data/distill                        # stdlib documents, greedy, 256 tokens
    python scripts/distill.py MODEL --out data/distill --max-minutes 25       # stops cleanly; rerun to continue
    python scripts/distill.py MODEL --out d --source files --paths 'corpus/**/*.py' --prompt-tokens 64,256
    python scripts/distill.py MODEL --out d --source hub --name DATASET --text-field content --max-prompts 5000
    python scripts/distill.py MODEL.gguf --out d --prompts questions.jsonl --chat-template --temperature 0.7
    python scripts/distill.py MODEL.gguf --out d --source tasks --chat-template   # stdlib functions, HumanEval-style
    python scripts/distill.py MODEL --out d --source tasks --paths src/ --packages requests
    python scripts/distill.py MODEL.gguf --out d --source tasks --chat-template --replies source  # teacher forcing
    python scripts/pretrain.py data=files 'data.source.paths=[data/distill/*.jsonl]' ...   # train on it

MODEL is anything scripts/decode.py reads: an mtp .ckpt, a Hugging Face Llama or Meta directory, a GGUF file.

Prompts come from the training split of a document source (--source, as data= describes it; --val-fraction as the
model's training used, so that the held-out documents the benchmarks prompt with are never distilled): from each
document --prompts-per-document spans of --prompt-tokens MIN,MAX tokens (random, seeded), the first opening the
document, each ending at the end of a line where one falls in range. Or from --prompts FILE: .jsonl, one JSON object
per line with the prompt under --prompt-field; .txt, one prompt per block of lines between blank lines. Or, with
--source tasks, from HumanEval-style tasks: the documented top-level functions of the Python files under --paths
(folders, .py files or globs) and of the installed --packages (default: the standard library), their training split
as --val-fraction splits files, tests left out; each as HumanEval writes a problem (the imports it uses, the def
line, the docstring; no body), in an order drawn by --seed; --prompt-tokens and --prompts-per-document do not apply.
With --chat-template each prompt is wrapped as a user message in the model's own chat template (instruct models); a
task is put as the decoding benchmark puts a HumanEval problem (EvalPlus's instruction, then the opening of the
reply). HumanEval's own problems are never distilled: a task or a --prompts prompt that holds one is refused (the
standard library has none).

The model continues each prompt by up to --new-tokens tokens (greedy by default: what heads drafting for greedy
decoding must predict), in batches of prompts of similar length, stopping a row at the model's end token. With
--replies source (--source tasks only) nothing is generated: each task's reply is its own function as written (the
def line through the body, then the code block's end and the model's end of turn), cut at --new-tokens; training
then reads that text once and the model's own next-token distribution labels every position (teacher forcing:
more tokens per minute than generating them, on a text the model did not write).

--out DIR gets distill-00000.jsonl, ... (rows {"text": prompt + completion, "prompt", "completion", "prompt_ids",
"completion_ids", "finish": "end"|"length"}; data=files trains on "text"), each written whole every --shard-prompts
prompts, and settings.json (the settings, each run, running totals). Rerunning the same command continues where the
last run stopped and writes what one uninterrupted run would have; other settings into the same DIR are refused
(--force starts over there). Budgets (--max-prompts, --max-tokens: the folder's totals; --max-minutes: this run)
end a run after a whole batch. The last line: key=value figures of this run, the folder's totals and why it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import itertools
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

import torch
from tqdm import tqdm

from mtp.checkpoint.load import chat_template_of, load_checkpoint, model_chat, resolve_dtype
from mtp.commands.cli import (
    Placement,
    flag_of,
    pick_device,
    require_at_least,
    run_script,
    settings_named_by_flags,
)
from mtp.commands.distill_prompts import (
    check_held_out,
    check_prompt_file,
    fitting_tasks,
    flags_for_sources,
    prompt_span,
    source_config,
    task_extraction,
)
from mtp.commands.distill_run import TASKS, DistillRun
from mtp.commands.schema import Part, add_parts, node_values
from mtp.data.sources import SourceConfig
from mtp.data.tokenizer import eot_id
from mtp.decode import GenerationConfig
from mtp.errors import UserError
from mtp.interop.chat import ChatTemplate, ModelChat
from mtp.pretrained.distill import (
    BATCHES_PER_SHARD,
    DistillSettings,
    Progress,
    distill,
    encode_prompts,
    file_prompts,
    given_replies,
    source_prompts,
    task_prompts,
)
from mtp.pretrained.distill_folder import DistillFolder, model_fingerprint

RENAMED_FLAGS = {"max_new_tokens": "--new-tokens", "deadline": "--max-minutes"}
"""The flag of each setting of mtp.pretrained.distill whose flag is not its name in kebab case (``batch_size``:
--batch-size)."""
SETTING_FLAGS = {
    "prompts.source.kind": "--source",
    "prompts.source.paths": "--paths",
    "prompts.source.name": "--name",
    "prompts.source.subset": "--subset",
    "prompts.source.split": "--split",
    "prompts.source.text_field": "--text-field",
    "prompts.source.streaming": "--streaming",
    "prompts.source.packages": "--packages",
    "prompts.val_fraction": "--val-fraction",
    "prompts.prompt_tokens": "--prompt-tokens",
    "prompts.per_document": "--prompts-per-document",
    "prompts.file": "--prompts",
    "prompts.prompt_field": "--prompt-field",
    "chat_template": "--chat-template",
    "replies": "--replies",
    "seed": "--seed",
    "new_tokens": "--new-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "batch_size": "--batch-size",
    "shard_prompts": "--shard-prompts",
    "dtype": "--dtype",
}
"""The flag of each setting recorded in settings.json (the model is named by its fingerprint instead)."""


SOURCE_FIELDS = (
    "source", "paths", "packages", "name", "subset", "split", "text_field", "streaming", "val_fraction",
    "prompt_tokens", "prompts_per_document",
)  # fmt: skip
SCHEMA = (
    Part(DistillRun, ("checkpoint", "out", "chat_template", "replies")),
    Part(DistillRun, SOURCE_FIELDS, title="prompts from documents (the training split of a source, as data= has it), "
         "or from tasks"),
    Part(DistillRun, ("prompts", "prompt_field"), title="prompts from a file (instead of a source)"),
    Part(DistillRun, ("new_tokens", "seed", "batch_size"), title="decoding"),
    Part(GenerationConfig, ("temperature", "top_k", "top_p"), title="sampling (default: greedy)"),
    Part(Placement, ("device", "dtype"), title="device and dtype"),
    Part(DistillRun, ("shard_prompts", "max_prompts", "max_tokens", "max_minutes", "force"), title="output and budgets",
         notes={"shard_prompts": f"default {BATCHES_PER_SHARD} batches"}),
)  # fmt: skip
"""The command's flags in their --help groups, and its node's keys in a training config: :class:`DistillRun`'s
fields, GenerationConfig's sampling and Placement's device and dtype."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parts(parser, SCHEMA)
    return parser


def settings_of(values: Mapping[str, Any]) -> DistillRun:
    """The distillation of the flags' values by name (``values``: the parsed flags, or a training run's ``distill``
    node over their defaults)."""
    return DistillRun(**{f.name: values[f.name] for f in fields(DistillRun)})


def settings_of_config(model: str, node: Mapping[str, Any]) -> DistillRun:
    """The distillation a training run's ``distill`` node asks of ``model`` (its ``init_from``): the node's keys are
    the flags' names (``max_tokens: 1000`` for ``--max-tokens 1000``), every flag it leaves out at its default."""
    if not node.get("out"):
        raise UserError("distill.out names no folder; set distill.out=DIR, where the distilled shards go.")
    return settings_of(node_values(SCHEMA, node, "distill", checkpoint=Path(model)))


def check_flags(args: DistillRun) -> None:
    """The flags that no settings class checks, before anything is read."""
    require_at_least(args, 1, "new_tokens", "prompts_per_document")
    require_at_least(args, 0, "max_minutes")
    if not 0 <= args.val_fraction < 1:
        raise UserError(f"--val-fraction {args.val_fraction} must lie in [0, 1); the default is 0.05.")
    if args.prompts is not None and (args.source is not None or args.paths or args.name or args.packages):
        raise UserError("--prompts replaces the document source; drop --source/--paths/--name, or drop --prompts.")
    if args.packages and args.source != TASKS:
        raise UserError("--packages names the packages whose tasks to distill; add --source tasks, or drop --packages.")
    if args.replies == "source" and args.source != TASKS:
        raise UserError(
            "--replies source gives each task its own function as the reply, and only --source tasks has tasks; add "
            "--source tasks, or drop --replies."
        )
    if args.prompts is not None and not args.prompts.is_file():
        raise UserError(
            f"prompt file {args.prompts} does not exist; pass an existing .jsonl or .txt file to --prompts."
        )
    if args.prompts is not None and args.prompts.suffix not in (".jsonl", ".txt"):
        suffix = args.prompts.suffix or "a file without suffix"
        raise UserError(f"--prompts {args.prompts}: cannot read {suffix}; use .jsonl or .txt.")
    if not args.checkpoint.exists():
        raise UserError(
            f"model {args.checkpoint} does not exist; pass an mtp .ckpt, a Hugging Face or Meta directory, or a GGUF "
            "file."
        )


def run_settings(args: DistillRun, started: float) -> DistillSettings:
    """The run's decoding, batches, shards and budgets from the flags (each checked by its class); the model's end
    tokens are added once it is loaded. --max-minutes counts from ``started``, the command's start."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    return DistillSettings(
        generation=GenerationConfig(max_new_tokens=args.new_tokens, seed=args.seed, **sampling),
        batch_size=args.batch_size,
        shard_prompts=args.shard_prompts,
        max_prompts=args.max_prompts,
        max_tokens=args.max_tokens,
        deadline=started + 60 * args.max_minutes if args.max_minutes else None,
    )


def stop_reason(stopped: str) -> str:
    """Why a run stopped as the last line says it: a budget as its flag (``--max-tokens``), else as it is."""
    settings = {field.name for field in fields(DistillSettings)}
    return RENAMED_FLAGS.get(stopped, flag_of(stopped)) if stopped in settings else stopped


def recorded_settings(
    args: DistillRun, source: SourceConfig | None, dtype: torch.dtype, run: DistillSettings
) -> dict[str, Any]:
    """Everything that decides the data, as settings.json records it (a rerun into the folder must match it)."""
    if args.source == TASKS:
        prompts = {
            "source": {"kind": TASKS, "paths": list(args.paths), "packages": list(args.packages)},
            "val_fraction": args.val_fraction,
        }
    elif source is not None:
        described = {key: value for key, value in asdict(source).items() if key != "max_documents"}
        prompts = {
            "source": described,
            "val_fraction": args.val_fraction,
            "prompt_tokens": list(prompt_span(args.prompt_tokens)),
            "per_document": args.prompts_per_document,
        }
    else:
        prompts = {"file": str(args.prompts.resolve()), "prompt_field": args.prompt_field}
    replies = {"replies": args.replies} if args.replies != "model" else {}  # folders made before --replies: model
    return {
        "model": model_fingerprint(args.checkpoint),
        "prompts": prompts,
        **replies,
        "chat_template": args.chat_template,
        "seed": args.seed,
        "new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "batch_size": run.batch_size,
        "shard_prompts": run.shard_prompts,
        "dtype": str(dtype).removeprefix("torch."),
    }


def describe_setting(key: str, value: Any) -> str:
    """A setting of settings.json as the flag that sets it: ``--temperature 0.8``, ``no --prompts``."""
    if key == "model.bytes":
        return f"a model of {value} bytes"
    if key == "model.sha256":
        return f"a model of fingerprint {str(value)[:16]}"
    flag = SETTING_FLAGS.get(key, key)
    if value is None or value is False:
        return f"no {flag}"
    if value is True:
        return flag
    if isinstance(value, list):
        return f"{flag} {','.join(map(str, value)) if key == 'prompts.prompt_tokens' else ' '.join(map(str, value))}"
    return f"{flag} {value}"


def run_record(args: DistillRun, argv: list[str] | None, device: torch.device) -> dict[str, Any]:
    """This run, as settings.json lists it: when, with what, where the model was, its budgets."""
    try:
        version = importlib.metadata.version("mtp")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "unknown"
    model = args.checkpoint.resolve()
    return {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "model_path": str(model),
        "model_mtime": datetime.fromtimestamp(model.stat().st_mtime, timezone.utc).isoformat(timespec="seconds"),
        "mtp_version": version,
        "torch_version": torch.__version__,
        "device": device.type,
        "budget": {"max_prompts": args.max_prompts, "max_tokens": args.max_tokens, "max_minutes": args.max_minutes},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (None: the process's arguments); 0, or 130 when Ctrl-C ended it early."""
    started = time.monotonic()
    return run(settings_of(vars(build_parser().parse_args(argv))), argv, started)


def run(args: DistillRun, argv: list[str] | None = None, started: float | None = None) -> int:
    """The distillation ``args`` asks for (``argv``: the command line settings.json records, None: this process's;
    ``started``: when the command started, which --max-minutes counts from, None: now); 0, or 130 when Ctrl-C ended
    it early. Errors name the flags."""
    started = time.monotonic() if started is None else started
    try:
        with settings_named_by_flags(RENAMED_FLAGS):  # the library names its settings; the user typed flags
            return distill_command(args, argv, started)
    except UserError as err:
        raise UserError(flags_for_sources(str(err))) from err


def distill_command(args: DistillRun, argv: list[str] | None, started: float) -> int:
    """The command behind :func:`main`: flags checked, the folder checked, the model loaded, the prompts decoded."""
    check_flags(args)
    run = run_settings(args, started)
    span = prompt_span(args.prompt_tokens)
    if args.chat_template:  # its sentences (no template, one that does not parse) before anything slow
        ChatTemplate(ModelChat(chat_template_of(args.checkpoint)), args.checkpoint)
    source = source_config(args)
    if args.prompts is not None:
        check_prompt_file(args.prompts, args.prompt_field)
    tasks = task_extraction(args) if args.source == TASKS else None
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    settings = recorded_settings(args, source, dtype, run)
    folder = DistillFolder(args.out, settings, run_record(args, argv, device), args.force, describe_setting)

    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    stdlib_tasks = tasks is not None and not (args.paths or args.packages)
    check_held_out(args, SourceConfig() if stdlib_tasks else source, loaded.data)  # stdlib tasks: the stdlib's split
    tokenizer = loaded.tokenizer
    chat = model_chat(args.checkpoint, tokenizer)
    template = ChatTemplate(chat, args.checkpoint) if args.chat_template else None
    end_id = eot_id(tokenizer)
    declared = tokenizer.token_to_id(chat.eos_token) if chat.eos_token else None
    end_ids = {end_id} | ({declared} if declared is not None else set())
    if template is not None and declared is not None:  # a chat turn ends at the model's own end of turn
        end_id = declared
    folder.record["runs"][-1].update(
        end_ids=sorted(end_ids),
        chat_template_sha256=hashlib.sha256(chat.template.encode()).hexdigest() if template is not None else None,
    )
    if tasks is not None:
        texts = task_prompts(tasks.tasks, args.seed)
    elif source is not None:
        texts = source_prompts(source, args.val_fraction, tokenizer, span, args.prompts_per_document, args.seed)
    else:
        texts = file_prompts(args.prompts, args.prompt_field)
    prompts = encode_prompts(texts, tokenizer, template, tasks=tasks is not None)
    if tasks is not None:
        prompts = iter(fitting_tasks(prompts, loaded.model.config.max_seq_len, args.new_tokens))
    if args.replies == "source":
        solutions = {task.origin: task.solution for task in tasks.tasks}
        prompts = given_replies(prompts, solutions, tokenizer, args.new_tokens, end_id)
    first = next(prompts, None)
    if first is None:
        if tasks is not None:
            raise UserError(
                f"no task fits the model's context of {loaded.model.config.max_seq_len} tokens with --new-tokens "
                f"{args.new_tokens}; lower --new-tokens."
            )
        if source is None:
            raise UserError(f"{args.prompts} holds no prompt; write one per line (.jsonl) or per block (.txt).")
        raise UserError(
            f"the training split of the {source.kind} source has no document longer than {span[0]} tokens; point "
            "--source/--paths at longer documents or lower --prompt-tokens."
        )

    end_text = (chat.eos_token or "") if template is not None else ""
    run = replace(run, generation=replace(run.generation, eos_id=end_id), end_ids=end_ids, end_text=end_text)
    progress_bar = progress_display(args.max_prompts)

    def show(progress: Progress) -> None:
        progress_bar.n = progress.totals.prompts
        # set_postfix_str refreshes the bar, showing n too
        progress_bar.set_postfix_str(f"tokens={progress.totals.tokens} tokens/s={progress.tokens_per_s:.1f}")

    with progress_bar:
        result = distill(loaded.model, tokenizer, itertools.chain([first], prompts), folder, run, show)
    totals = result.totals
    print(
        f"prompts={result.prompts} tokens={result.tokens} seconds={result.seconds:.1f} "
        f"tokens/s={result.tokens_per_s:.1f} total_prompts={totals.prompts} total_tokens={totals.tokens} "
        f"stopped={stop_reason(result.stopped)} out={args.out}"
    )
    return 130 if result.stopped == "interrupted" else 0


def progress_display(total: int) -> tqdm:
    """A progress bar (tqdm, installed with datasets) of the prompts in --out and this run's tokens/s, on stderr."""
    return tqdm(total=total or None, unit="prompt", desc="distill", dynamic_ncols=True, mininterval=1.0)


def entry_point() -> NoReturn:
    """mtp-distill and scripts/distill.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
