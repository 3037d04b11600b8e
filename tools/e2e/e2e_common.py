"""Shared helpers of the end-to-end checks and the benchmarks: offline settings, which source
files a lane folder shows, SHA-256 comparison of folders, tensor comparison of safetensors files,
a small PASS/FAIL reporter, the release build, and a `Mount` that always unmounts.

Imported by the scripts beside it (their folder is on sys.path when they run as scripts) and by
tools/bench and tools/decode_bench.py.
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

# Nothing may reach a model hub: every load is from a local folder.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DIFFUSERS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def go_offline():
    """Sets the offline variables (before transformers or diffusers is imported)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def quiet():
    """Turns off the libraries' progress bars (after they are importable)."""
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass
    try:
        import diffusers

        diffusers.utils.logging.disable_progress_bar()
    except Exception:
        pass


# Folders the importer never reads (version control, download caches).
SKIPPED_DIRS = {".git", ".cache", ".huggingface"}

# Only these stems carry a weights variant (`model.fp16.safetensors`), as Diffusers and
# Transformers name them; `sd_xl_base_1.0.safetensors` is a file of no variant.
VARIANT_STEMS = ("diffusion_pytorch_model", "model")
_SHARD = re.compile(r"^(.*)-\d+-of-\d+$")


def weights_kind(name):
    """Classifies a file name as ("file", variant), ("index", variant) or None.

    `model.safetensors` → ("file", None); `model.fp16.safetensors` and
    `diffusion_pytorch_model.fp16-00001-of-00002.safetensors` → ("file", "fp16");
    `model.safetensors.index.fp16.json` → ("index", "fp16"); `config.json` → None.
    """

    def variant_of(base):
        for stem in VARIANT_STEMS:
            if base.startswith(stem + "."):
                v = base[len(stem) + 1 :]
                if v and "." not in v:
                    return v
        return None

    if name.endswith(".safetensors"):
        base = name[: -len(".safetensors")]
        m = _SHARD.match(base)
        return ("file", variant_of(m.group(1) if m else base))
    if ".safetensors.index" in name:
        tail = name.split(".safetensors.index", 1)[1]
        if tail == ".json":
            return ("index", None)
        if tail.startswith(".") and tail.endswith(".json"):
            v = tail[1:-5]
            if v and "." not in v:
                return ("index", v)
    return None


def source_files(root):
    """Every file under `root` by relative POSIX path (following symlinks, skipping SKIPPED_DIRS)."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if p.is_file():
                out[p.relative_to(root).as_posix()] = p
    return out


def lane_files(root, variant=None):
    """The source files a lane folder of weights variant `variant` shows (None: the default lane).

    Every file, except weights files and shard indexes of other variants; a folder without any
    `variant` weights files shows its default weights (and default index) instead.
    """
    files = source_files(root)
    by_dir = {}
    for rel in files:
        d, _, name = rel.rpartition("/")
        by_dir.setdefault(d, []).append(name)
    keep = {}
    for d, names in by_dir.items():
        kinds = {n: weights_kind(n) for n in names}
        has_variant = any(k == ("file", variant) for k in kinds.values())
        pick = variant if has_variant else None
        for n in names:
            k = kinds[n]
            if k is None or k[1] == pick:
                rel = f"{d}/{n}" if d else n
                keep[rel] = files[rel]
    return dict(sorted(keep.items()))


def sha256_file(path, bufsize=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def compare_files(expected, mounted_root):
    """Compares `expected` ({rel: source path}) with the files under `mounted_root`.

    Returns a dict: equal (count), total (expected count), missing, different (rel paths),
    extra (files the mounted folder has beyond `expected`).
    """
    mounted = source_files(mounted_root)
    missing, different, equal = [], [], 0
    for rel, src in expected.items():
        if rel not in mounted:
            missing.append(rel)
            continue
        a, b = sha256_file(src), sha256_file(mounted[rel])
        if a == b:
            equal += 1
        else:
            different.append(f"{rel} (source {a[:16]}…, mounted {b[:16]}…, "
                             f"{Path(src).stat().st_size} vs {mounted[rel].stat().st_size} bytes)")
    extra = sorted(set(mounted) - set(expected))
    return {"equal": equal, "total": len(expected), "missing": missing, "different": different, "extra": extra}


def safetensors_files(folder, variant=None):
    """The weights files of one component folder that a loader of `variant` would read."""
    folder = Path(folder)
    names = [p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(".safetensors")]
    has_variant = any(weights_kind(n) == ("file", variant) for n in names)
    pick = variant if has_variant else None
    return sorted(folder / n for n in names if weights_kind(n)[1] == pick)


def load_tensors(paths):
    """Every tensor of `paths` by name (as torch tensors); a name in two files is an error."""
    from safetensors import safe_open

    out = {}
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            for k in f.keys():
                if k in out:
                    raise ValueError(f"tensor {k!r} is in two files (second: {p})")
                out[k] = f.get_tensor(k)
    return out


def compare_tensors(a, b):
    """Compares two {name: tensor} maps exactly (dtype, shape, bytes). Returns a list of problems."""
    import torch

    problems = []
    for k in sorted(set(a) | set(b)):
        if k not in b:
            problems.append(f"{k}: missing from the second")
        elif k not in a:
            problems.append(f"{k}: only in the second")
        elif a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            problems.append(f"{k}: {a[k].dtype}{list(a[k].shape)} vs {b[k].dtype}{list(b[k].shape)}")
        elif not torch.equal(a[k], b[k]):
            problems.append(f"{k}: values differ")
    return problems


def load_json(path):
    with open(path, "rb") as f:
        return json.load(f)


class Report:
    """Collects named checks and prints PASS/FAIL lines as they come."""

    def __init__(self, tool):
        self.tool = tool
        self.failures = []
        self.passes = []

    def check(self, ok, name, detail=""):
        line = f"{'PASS' if ok else 'FAIL'}: {name}" + (f" — {detail}" if detail else "")
        print(f"[{self.tool}] {line}", flush=True)
        (self.passes if ok else self.failures).append(name)
        return ok

    def note(self, text):
        print(f"[{self.tool}]   {text}", flush=True)

    def files(self, result, what="files"):
        """Reports a compare_files result; returns whether it passed."""
        ok = not (result["missing"] or result["different"] or result["extra"])
        self.check(ok, f"{what} SHA-256", f"{result['equal']}/{result['total']} equal")
        for rel in result["missing"]:
            self.note(f"missing from the mounted folder: {rel}")
        for rel in result["different"]:
            self.note(f"different: {rel}")
        for rel in result["extra"]:
            self.note(f"extra in the mounted folder: {rel}")
        return ok

    def finish(self, summary):
        """Prints the closing line and returns the exit code (0 only when nothing failed)."""
        if self.failures:
            print(f"RESULT: FAIL — {len(self.failures)} check(s) failed: {', '.join(self.failures)}", flush=True)
            return 1
        print(f"RESULT: PASS — {summary}", flush=True)
        return 0


def die(tool, message):
    print(f"[{tool}] FAIL: {message}", file=sys.stderr, flush=True)
    print(f"RESULT: FAIL — {message}", flush=True)
    sys.exit(1)


def mounted_paths():
    """Mount points listed in /proc/self/mounts (octal escapes decoded)."""
    out = set()
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 1:
                    out.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
    except OSError:
        pass
    return out


def is_mounted(path):
    """Whether `path` is a mount point (also when the daemon died and left a stale mount).

    A FUSE mount has its own device number; the mount table is read up to three times because
    a read of /proc/self/mounts can skip entries while other processes mount or unmount.
    """
    real = os.path.realpath(path)
    try:
        if os.stat(real).st_dev != os.stat(os.path.join(real, "..")).st_dev:
            return True
    except OSError:
        pass
    return any(real in mounted_paths() for _ in range(3))


def exit_on_signals():
    """Turns SIGTERM and SIGHUP into SystemExit, so `with Mount(...)` still unmounts when a
    time limit or CI stops the script."""
    import signal

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


class Mount:
    """`tensorfs --store STORE mount MOUNTPOINT --foreground` as a child process.

    Entering waits until the mount point appears in /proc/mounts (the daemon's output goes to
    `log`); leaving always unmounts: `tensorfs unmount`, then `fusermount3 -uz` / `umount -l` if
    the mount is still there, then waits for the daemon (terminating it if it lingers).
    """

    def __init__(self, tensorfs, store, mountpoint, log, timeout_s=60, args=()):
        self.tensorfs, self.store, self.mountpoint, self.log = str(tensorfs), str(store), Path(mountpoint), Path(log)
        self.timeout_s = timeout_s
        self.args = [str(a) for a in args]
        self.proc = None

    def __enter__(self):
        import subprocess
        import time

        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if is_mounted(self.mountpoint):
            force_unmount(self.mountpoint)
        logf = open(self.log, "ab")
        cmd = [self.tensorfs, "--store", self.store, "mount", str(self.mountpoint), "--foreground", *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + self.timeout_s
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"`{' '.join(cmd)}` exited with {self.proc.returncode} before mounting:\n"
                                   + tail(self.log))
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"`{' '.join(cmd)}`: no mount at {self.mountpoint} after {self.timeout_s} s:\n"
                                   + tail(self.log))
            time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        import subprocess

        # Asked even when the mount seems gone: a missed table entry must not leave it behind.
        try:
            subprocess.run([self.tensorfs, "unmount", str(self.mountpoint)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if is_mounted(self.mountpoint):
            force_unmount(self.mountpoint)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if is_mounted(self.mountpoint):
            force_unmount(self.mountpoint)
        return False


def force_unmount(path):
    """Lazily unmounts `path` (a stale or busy FUSE mount), whatever tool is there."""
    import shutil
    import subprocess

    for cmd in (["fusermount3", "-uz"], ["fusermount", "-uz"], ["umount", "-l"]):
        if not is_mounted(path):
            return
        if shutil.which(cmd[0]):
            subprocess.run(cmd + [str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)


def release_build(root, bins=(), examples=(), build=True):
    """Builds the release `bins` and `examples` of the crate at `root` with cargo (its progress
    goes to stderr) and returns the folder that holds them, `<target dir>/release`.

    The target directory is cargo's own answer (`cargo metadata`), so CARGO_TARGET_DIR and
    .cargo/config are honoured; without cargo it is $CARGO_TARGET_DIR, else `root/target`.
    `build=False` only finds the folder. Raises subprocess.CalledProcessError when cargo fails.
    """
    import shutil
    import subprocess

    root = Path(root)
    if build:
        targets = [a for b in bins for a in ("--bin", b)] + [a for e in examples for a in ("--example", e)]
        subprocess.run(["cargo", "build", "--release", *targets], cwd=root, check=True, stdout=sys.stderr)
    if shutil.which("cargo"):
        meta = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=root,
                              check=True, capture_output=True, text=True).stdout
        target = Path(json.loads(meta)["target_directory"])
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target")
    return target / "release"


def tail(path, lines=30):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])
