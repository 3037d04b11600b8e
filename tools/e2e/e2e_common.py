"""Shared helpers of the end-to-end checks: offline settings, which source files a lane folder
shows, SHA-256 comparison of folders, tensor comparison of safetensors files, and a small
PASS/FAIL reporter.

Imported by the scripts beside it (their folder is on sys.path when they run as scripts).
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
