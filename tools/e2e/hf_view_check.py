#!/usr/bin/env python3
"""Check that the mount's hub cache view serves models by repo id, as the libraries load them.

    hf_view_check.py transformers --cache MOUNT/@hf --repo ORG/NAME --source DIR [--commit ID]
    hf_view_check.py diffusers    --cache MOUNT/@hf --repo ORG/NAME --source DIR

With HF_HUB_CACHE=--cache, and for each network mode (`offline`: HF_HUB_OFFLINE=1;
`unreachable`: online, the endpoint a closed port; `refusing`: online, an endpoint that answers
every request 404 RepoNotFound, as for a repo the hub does not have), each in its own process:

- transformers: AutoModel.from_pretrained(ORG/NAME) has --source's parameters (torch.equal);
  hf_hub_download(config.json) and snapshot_download(ORG/NAME) (local_files_only=True when
  offline) give the source's bytes. Offline only (online, transformers asks the endpoint for
  optional files and huggingface_hub retries each for ~23 s): AutoTokenizer + AutoModel embed
  sentences exactly as from --source, also with revision= "main", the snapshot's 40-hex commit
  and --commit (a TensorFS commit id, `sha256:` dropped); SentenceTransformer(ORG/NAME)
  encodes as SentenceTransformer(--source).
- diffusers: DiffusionPipeline.from_pretrained(ORG/NAME) and (…, variant="fp16",
  dtype=float16) have every parameter equal to the same loads from --source, whose fp16
  files must differ from its default ones cast (tiny_sd.py --fp16-distinct), so the variant
  load shows it read the variant's files.

An audit hook records every write the libraries try under the cache (open for writing, mkdir,
rename, symlink, remove); the check fails if there is any. Prints PASS/FAIL lines and a closing
`RESULT: PASS — …` or `RESULT: FAIL — …` line; exits 0 only when every check passed.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402

TOOL = "hf_view_check"
MODES = ("offline", "unreachable", "refusing")
SENTENCES = [
    "This framework generates embeddings for each input sentence.",
    "The quick brown fox jumps over the lazy dog.",
]
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def start_refusing_endpoint():
    """A loopback server answering every request 404 RepoNotFound; returns its URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuse(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self):
            body = b'{"error": "Repository Not Found"}'
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def closed_port_endpoint():
    """A loopback URL nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def set_network(mode):
    """Sets the environment of `mode` (before huggingface_hub is imported)."""
    common.go_offline()
    if mode == "offline":
        return
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[key] = "0"
    endpoint = closed_port_endpoint() if mode == "unreachable" else start_refusing_endpoint()
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_ETAG_TIMEOUT"] = "2"
    os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = "2"


def watch_writes(root):
    """Records every write-like operation under `root`; returns the list it fills."""
    root = os.path.realpath(root)
    seen = []

    def under(path):
        try:
            p = os.fsdecode(path)
        except TypeError:
            return False
        return os.path.realpath(p).startswith(root + os.sep) or os.path.realpath(p) == root

    def hook(event, args):
        try:
            if event == "open" and args[0] is not None and not isinstance(args[0], int):
                mode, flags = args[1] or "", args[2] or 0
                if (any(c in mode for c in "wax+") or flags & WRITE_FLAGS) and under(args[0]):
                    seen.append(f"open({os.fsdecode(args[0])!r}, {mode or flags})")
            elif event in ("os.mkdir", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.truncate"):
                target = args[1] if event in ("os.symlink", "os.link") else args[0]
                if under(target):
                    seen.append(f"{event}({os.fsdecode(target)!r})")
            elif event in ("os.rename", "os.replace"):
                if under(args[0]) or under(args[1]):
                    seen.append(f"{event}({os.fsdecode(args[0])!r}, {os.fsdecode(args[1])!r})")
        except Exception:  # an audit hook must never raise
            pass

    sys.addaudithook(hook)
    return seen


def check(report, name, ok, detail=""):
    return report.check(bool(ok), name, detail)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def state_equal(a, b):
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def check_transformers(report, args, mode):
    import torch
    from huggingface_hub import hf_hub_download, snapshot_download
    from transformers import AutoModel, AutoTokenizer

    def load(name, **kw):
        return AutoModel.from_pretrained(name, dtype=torch.float32, **kw).eval()

    def embed(name, **kw):
        tokenizer = AutoTokenizer.from_pretrained(name, **kw)
        batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
        with torch.no_grad():
            return load(name, **kw)(**batch).last_hidden_state

    want_state = load(str(args.source)).state_dict()
    check(report, f"[{mode}] AutoModel.from_pretrained({args.repo!r}) has the source's parameters",
          state_equal(want_state, load(args.repo).state_dict()))
    path = hf_hub_download(args.repo, "config.json", local_files_only=mode == "offline")
    check(report, f"[{mode}] hf_hub_download(config.json) is the source's",
          Path(path).read_bytes() == (args.source / "config.json").read_bytes(), path)
    folder = Path(snapshot_download(args.repo, local_files_only=mode == "offline"))
    source_files = {p.relative_to(args.source).as_posix(): sha256(p) for p in args.source.rglob("*") if p.is_file()}
    got_files = {p.relative_to(folder).as_posix(): sha256(p) for p in folder.rglob("*") if p.is_file()}
    check(report, f"[{mode}] snapshot_download holds the source's files", source_files == got_files,
          f"{len(got_files)} files; missing {sorted(source_files.keys() - got_files.keys())}, "
          f"extra {sorted(got_files.keys() - source_files.keys())}")
    if mode != "offline":
        # Online, transformers asks the endpoint for optional files (chat templates, added
        # tokens) and huggingface_hub retries each for ~23 s when it cannot reach it: the
        # tokenizer and sentence-transformers loads are checked offline only.
        return
    want = embed(str(args.source))
    check(report, f"[{mode}] AutoTokenizer + AutoModel({args.repo!r}) embed as the source", torch.equal(want, embed(args.repo)))
    snapshot = (Path(args.cache) / ("models--" + args.repo.replace("/", "--")) / "refs" / "main").read_text()
    revisions = ["main", snapshot] + ([args.commit.removeprefix("sha256:")] if args.commit else [])
    for rev in revisions:
        check(report, f"[{mode}] revision={rev[:12]}… embeds the same", torch.equal(want, embed(args.repo, revision=rev)))

    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(args.source), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    got = SentenceTransformer(args.repo, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    check(report, f"[{mode}] SentenceTransformer({args.repo!r}) encodes as the source", torch.equal(want, got))


def check_diffusers(report, args, mode):
    import torch
    from diffusers import DiffusionPipeline

    def params(pipe):
        out = {}
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module):
                for key, value in component.state_dict().items():
                    out[f"{name}.{key}"] = value
        return out

    half = {"dtype": torch.float16}
    default_as_half = params(DiffusionPipeline.from_pretrained(str(args.source), **half))
    variant = params(DiffusionPipeline.from_pretrained(str(args.source), variant="fp16", **half))
    # Else an equal load could have read the default files and cast them.
    check(report, f"[{mode}] the source's fp16 files differ from its default files cast to float16",
          not state_equal(default_as_half, variant), "build it with tiny_sd.py --fp16-distinct")
    for kw in ({}, {"variant": "fp16", **half}):
        want = params(DiffusionPipeline.from_pretrained(str(args.source), **kw))
        got = params(DiffusionPipeline.from_pretrained(args.repo, **kw))
        label = ", ".join(f"{k}={v}" for k, v in kw.items()) or "default"
        check(report, f"[{mode}] DiffusionPipeline.from_pretrained({args.repo!r}, {label}) equals the source",
                     state_equal(want, got), f"{len(got)} tensors")


def run_mode(args):
    set_network(args.mode)
    os.environ["HF_HUB_CACHE"] = str(args.cache)
    writes = watch_writes(args.cache)
    common.quiet()
    report = common.Report(TOOL)
    try:
        {"transformers": check_transformers, "diffusers": check_diffusers}[args.kind](report, args, args.mode)
    except Exception as e:  # a load that fails is a failed check, with its message
        check(report, f"[{args.mode}] loads", False, f"{type(e).__name__}: {e}")
    check(report, f"[{args.mode}] nothing was written under the cache", not writes, "; ".join(writes[:5]))
    return report.finish(f"{args.kind} {args.repo} [{args.mode}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("transformers", "diffusers"))
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--source", required=True, type=Path)
    ap.add_argument("--commit")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        return run_mode(args)
    failed = []
    for mode in MODES:
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode])
        if child.returncode != 0:
            failed.append(mode)
    if failed:
        print(f"RESULT: FAIL — {args.kind} {args.repo}: failed in {', '.join(failed)}")
        return 1
    print(f"RESULT: PASS — {args.kind} {args.repo} loads by repo id in {', '.join(MODES)} modes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
