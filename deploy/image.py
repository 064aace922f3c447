"""Build the container image from the Dockerfile, as a user or the release workflow does, and
report its size layer by layer.

    python -m deploy.image [--tag NAME:TAG] [--base IMAGE] [--engine docker|podman] [--save FILE]
                           [--platform P,P --push --metadata-file FILE]   (docker buildx: a release)

The base is the Dockerfile's (python:3.11-slim) unless --base names another. When a registry
serves it, it is pulled and pinned by digest (``name@sha256:...``, recorded in the
``org.opencontainers.image.base.*`` labels). When none does (a machine that reaches only package
mirrors), a base with the same contents (Debian bookworm's python3, pip, venv, openssl and
ca-certificates) is built from Debian's packages with mmdebstrap and tagged locally, once.

The labels (version, revision, source, licenses) come from pyproject.toml and the git checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASE = "python:3.11-slim"
NAME = "node-workload-summary"
LOCAL_BASE = "localhost/node-workload-summary-base:bookworm"
# What python:3.11-slim gives the Dockerfile: python (3.11), pip, venv, openssl, CA certificates.
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "openssl", "ca-certificates")
DEBIAN_SUITE = "bookworm"
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
PULL_TIMEOUT = 120


class ImageError(RuntimeError):
    """The image cannot be built; the message says what to install or set."""


def say(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def revision() -> str:
    """The checkout's commit, "-dirty" when files differ from it; "unknown" outside git."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def source() -> str:
    """The repository's web address, from the origin remote ("" without one); never its credentials."""
    url = _git("remote", "get-url", "origin")
    match = re.match(r"^(?:git@|ssh://git@)([^:/]+)[:/](.+?)(?:\.git)?$", url)
    if match:
        return f"https://{match[1]}/{match[2]}"
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=parts.hostname or "").geturl().removesuffix(".git") if parts.scheme else ""


@dataclass(frozen=True)
class Engine:
    command: str

    def run(self, *args: str, check: bool = True, timeout: float | None = None,
            capture: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.command, *args], capture_output=capture, text=True, check=check, timeout=timeout)

    def exists(self, image: str) -> bool:
        return self.run("image", "inspect", image, check=False).returncode == 0

    def build_flags(self) -> list[str]:
        # Podman's default isolation needs a cgroup manager it can drive; chroot isolation runs the
        # RUN steps anywhere root can chroot (also in a container or a VM with cgroup v1).
        # --no-cache: buildah 1.28 (Debian's podman 4.3) keys a cached RUN layer without the content
        # of its `--mount=type=bind,from=build`, so the install layer would keep an older wheel.
        return ["--isolation=chroot", "--pull=never", "--no-cache"] if self.command == "podman" else []


def find_engine(wanted: str | None) -> Engine:
    for command in [wanted] if wanted else ["docker", "podman"]:
        if shutil.which(command) is None:
            continue
        if subprocess.run([command, "info"], capture_output=True, check=False).returncode == 0:
            return Engine(command)
        if wanted:
            raise ImageError(f"{command} is installed but `{command} info` fails (is its daemon running?)")
    raise ImageError("no container engine: install docker or podman (Debian: `make image-tools` installs "
                     "podman, buildah and mmdebstrap)")


def pinned(engine: Engine, image: str) -> str | None:
    """``image`` pulled and named by digest, or None when no registry serves it."""
    if "@sha256:" in image:
        return image
    say(f"pulling {image} ...")
    try:
        pulled = engine.run("pull", image, check=False, timeout=PULL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    if pulled.returncode != 0:
        say(f"  cannot pull {image} (no registry serves it here)")
        return None
    digests = engine.run("image", "inspect", "--format", "{{json .RepoDigests}}", image).stdout
    repo = image.split(":")[0] if ":" in image.rsplit("/", 1)[-1] else image
    for ref in json.loads(digests or "[]") or []:
        if ref.split("@")[0].endswith(repo.split("/")[-1]):
            return f"{image.split('@')[0]}@{ref.split('@')[1]}"
    return image


def apt_sources() -> Path | None:
    return next((p for p in APT_SOURCES if p.is_file() and p.read_text().strip()), None)


def debian_base(engine: Engine, tag: str = LOCAL_BASE) -> str:
    """The local stand-in for python:3.11-slim, built from Debian's packages once."""
    if engine.exists(tag):
        say(f"base: {tag} (built earlier from Debian's packages)")
        return tag
    if shutil.which("mmdebstrap") is None:
        raise ImageError("no registry serves the base image and mmdebstrap is not installed to build one "
                         "from Debian's packages: `make image-tools`, or --base IMAGE")
    say(f"base: building {tag} from Debian {DEBIAN_SUITE}'s packages ({', '.join(DEBIAN_PACKAGES)}) ...")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        mirror = [str(p) for p in [apt_sources()] if p is not None]
        subprocess.run([
            "mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", "--format=tar",
            # The machine's apt sources serve the build only: the image keeps none of them.
            '--customize-hook=rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*',
            # As Debian's slim images: no manuals, docs or translations (the copyright files stay).
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            DEBIAN_SUITE, str(rootfs), *mirror], check=True)
        engine.run("import", "--change", "CMD [\"python3\"]", str(rootfs), tag)
    say(f"  built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def ca_mounts() -> list[str]:
    """Where this machine's pip trusts a CA bundle of its own (PIP_CERT or pip's configuration),
    the build's pip must trust it too: mounted read-only at the same path (podman only)."""
    cert = os.environ.get("PIP_CERT") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True, text=True,
        check=False).stdout.strip()
    if not cert or not Path(cert).is_file():
        return []
    return ["--volume", f"{cert}:{cert}:ro"]


def layers(engine: Engine, image: str) -> list[tuple[int, str]]:
    """(bytes, created by) of each layer, base first; empty layers (ENV, LABEL, ...) left out."""
    history = json.loads(engine.run("history", "--no-trunc", "--format", "json", image).stdout or "[]")
    rows = []
    for entry in reversed(history):
        size = entry.get("size", entry.get("Size", 0))
        size = int(size) if isinstance(size, int | float) or str(size).isdigit() else _parse_size(str(size))
        created = entry.get("createdBy", entry.get("CreatedBy", ""))
        if size:
            rows.append((size, " ".join(created.replace("/bin/sh -c ", "").split())))
    return rows


def _parse_size(text: str) -> int:
    match = re.match(r"([\d.]+)\s*([kKMG]?B)", text)
    if not match:
        return 0
    return int(float(match[1]) * {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}[match[2]])


def report(engine: Engine, image: str) -> str:
    rows = layers(engine, image)
    total = int(engine.run("image", "inspect", "--format", "{{.Size}}", image).stdout.strip() or 0)
    lines = [f"{image}: {total / 1e6:.1f} MB in {len(rows)} layers"]
    lines += [f"  {size / 1e6:8.1f} MB  {created[:100]}" for size, created in rows]
    return "\n".join(lines)


def build(tag: str, base: str | None, engine: Engine, release: list[str] | None = None) -> str:
    """``release``: docker buildx flags (--platform, --push, ...): a multi-platform build pushed
    to the registry with an SBOM and provenance, as the release workflow makes it."""
    base_ref = pinned(engine, base or DEFAULT_BASE)
    if base_ref is None and base and engine.exists(base):
        base_ref = base  # a local image: used as it is
    if base_ref is None:
        if base:
            raise ImageError(f"--base {base}: cannot pull it, and it is not a local image")
        base_ref = debian_base(engine)
    say(f"building {tag} from the Dockerfile on {base_ref} ...")
    started = time.monotonic()
    labels = {"org.opencontainers.image.base.name": base_ref.split("@")[0],
              "org.opencontainers.image.version": version(), "org.opencontainers.image.revision": revision()}
    if "@" in base_ref:
        labels["org.opencontainers.image.base.digest"] = base_ref.split("@")[1]
    # The Dockerfile sets these from its build arguments too; given here as well because podman
    # 4.3 (buildah 1.28) reuses a cached layer whose build arguments changed: a new commit would
    # keep the old revision.
    labels["org.opencontainers.image.source"] = source()
    env = [f"--env=NODE_WORKLOAD_SUMMARY_REVISION={revision()}"] if engine.command == "podman" else []
    args = [
        *(["buildx", "build", "--sbom=true", "--provenance=mode=max", *release] if release else ["build"]),
        *engine.build_flags(), "--file", str(ROOT / "Dockerfile"), "--tag", tag,
        "--build-arg", f"BASE={base_ref}", "--build-arg", f"VERSION={version()}",
        "--build-arg", f"REVISION={revision()}", "--build-arg", f"SOURCE={source()}",
        *(f"--label={k}={v}" for k, v in labels.items()), *env,
        *(ca_mounts() if engine.command == "podman" else []), str(ROOT),
    ]
    proc = engine.run(*args, check=False, capture=False)
    if proc.returncode != 0:
        raise ImageError(f"{engine.command} build failed (exit {proc.returncode}); its output is above")
    say(f"  built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.image", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default=f"{NAME}:{version()}", help="image name:tag (default: %(default)s)")
    parser.add_argument("--base", help=f"base image (default: {DEFAULT_BASE}, or one built from Debian's "
                                       "packages when no registry serves it)")
    parser.add_argument("--engine", choices=("docker", "podman"), help="default: docker if its daemon answers, "
                                                                      "else podman")
    parser.add_argument("--save", type=Path, help="also write the image as an OCI archive to this file")
    release = parser.add_argument_group("a release (docker buildx)")
    release.add_argument("--platform", help="e.g. linux/amd64,linux/arm64")
    release.add_argument("--push", action="store_true", help="push to the registry --tag names (with an SBOM "
                                                             "and provenance attached)")
    release.add_argument("--metadata-file", type=Path, help="buildx's build result (the pushed digest) as JSON")
    args = parser.parse_args(argv)
    buildx = [*(["--platform", args.platform] if args.platform else []), *(["--push"] if args.push else []),
              *(["--metadata-file", str(args.metadata_file)] if args.metadata_file else [])]
    try:
        engine = find_engine(args.engine)
        if buildx and engine.command != "docker":
            raise ImageError("--platform, --push and --metadata-file need docker buildx")
        image = build(args.tag, args.base, engine, buildx)
        if args.push:  # nothing local to measure: the platforms' images are in the registry
            return 0
        print(report(engine, image))
        if args.save:
            args.save.unlink(missing_ok=True)
            oci = ["--format", "oci-archive"] if engine.command == "podman" else []
            engine.run("save", *oci, "--output", str(args.save), image)
            say(f"saved {image} to {args.save} ({args.save.stat().st_size / 1e6:.1f} MB)")
    except ImageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as err:
        print(f"error: {' '.join(map(str, err.cmd[:3]))} ... failed (exit {err.returncode}): "
              f"{(err.stderr or '').strip()[-500:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
