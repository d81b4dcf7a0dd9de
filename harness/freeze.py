"""What a protocol's tag freezes, and the check that nothing frozen drifted before a run.

``harness tag`` writes a small machine-readable *freeze manifest* into the annotated tag's
message. It binds everything that defines the experiment:

* the protocol file's sha256 and every referenced configuration's sha256;
* the plan's sha256 and run count (so the order algorithm cannot change);
* the git object id, at the tagged commit, of **every top-level entry of the repository except
  the few listed in** :data:`EXEMPT` (records, other protocols, tests, benchmarks, docs, CI). A new
  folder (a plug-in package, a verified-paths folder) joins the freeze set by construction: only
  an explicit exemption keeps something out, and the manifest lists the exemptions;
* the sha256 of the running packages' sources (:func:`code_sha256`), so the code that
  executes is the tagged code even when the package is installed outside the repository.

The manifest's own sha256 (canonical JSON) is stored in every record and starts the ledger.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from harness import gitutil
from harness.packages import package_dirs
from prereg.bounded import InputLimitError, file_problem, read_present, read_regular, read_target
from prereg.commands import commands_of, refs_of
from prereg.errors import RefusedError
from prereg.formats.ledger import read_json
from prereg.formats.record import canonical, sha256_bytes
from prereg.protocol.schema import CommandArm
from prereg.tag import (
    FREEZE_MARKER,
    PLOT_FILES,
    RESULT_FILE,
    frozen_trees,
    is_exempt,
    parse_manifest,
    parse_result,
    result_message,
)

if TYPE_CHECKING:
    from harness.protocol import Protocol

FORMAT = 1

#: Top-level entries that cannot change an outcome: records are the outcomes, ``protocols/`` holds
#: later protocols (the frozen one is bound by its own sha256), the rest is documentation, tests
#: and CI. Top-level ``*.md`` files are exempt too. Everything else is frozen.
EXEMPT = frozenset(
    {"records", "protocols", "tests", "benchmarks", "docs", ".ci", ".github", ".gitignore", "LICENSE", "runs"}
)

#: The manifest's ``exempt`` list: the names and the ``*.md`` pattern (read by the core's rule).
EXEMPT_LIST = [*sorted(EXEMPT), "*.md"]


def exempt(entry: str) -> bool:
    """Whether a top-level entry is outside the freeze (the core's rule, on :data:`EXEMPT_LIST`)."""
    return is_exempt(entry, EXEMPT_LIST)


def code_sha256() -> dict[str, str]:
    """sha256 over the source files (``*.py``, ``*.c``) of each of the project's packages
    (:func:`package_dirs`), by package name; ``harness`` is the one a record's
    ``env.harness_sha256`` holds.

    In a worker (``$HARNESS_SOURCES`` set, :func:`harness.execute.launchers.source_hashes`) it is
    computed from the hashes of the bytes the runner read once and the worker's imports were
    checked against, not from a second read of the files, which could find other bytes than
    the ones that ran."""
    given = os.environ.get("HARNESS_SOURCES")
    sources: dict[str, dict[str, str]] = json.loads(given) if given else {}
    out = {}
    for base in package_dirs():
        if str(base) in sources:
            listed = sources[str(base)]
            hashes = {base / rel: sha for rel, sha in listed.items()}
        else:
            files = [*base.rglob("*.py"), *base.rglob("*.c")]
            hashes = {p: sha256_bytes(read_target(str(p))) for p in files if "__pycache__" not in p.parts}
        lines = [f"{p.relative_to(base).as_posix()}:{hashes[p]}" for p in sorted(hashes)]
        out[base.name] = sha256_bytes("\n".join(lines).encode())
    return out


def frozen_entries(repo: Path, rev: str) -> dict[str, str]:
    """Top-level entries of ``rev``'s tree that are frozen, with their git object ids (the core's
    :func:`prereg.tag.frozen_trees`, which the audit compares records' commits with)."""
    trees = frozen_trees(str(repo), rev, EXEMPT_LIST)
    if trees is None:
        raise RefusedError(f"{repo}: {rev!r} is not a commit of this repository (git ls-tree failed)")
    return trees


class ProtocolBinding(TypedDict):
    """The protocol a manifest freezes: its id, its path in the repository, its bytes' sha256."""

    id: str
    path: str
    sha256: str


class PlanBinding(TypedDict):
    """The plan a manifest freezes: its sha256 and how many runs it holds."""

    sha256: str
    runs: int


class CommandBindings(TypedDict):
    """What command arms run besides the frozen trees (:func:`command_bindings`)."""

    refs: dict[str, str | None]  # each ref's tree id (None: not a commit here)
    python: str  # the interpreter, "implementation version"
    packages: dict[str, str]  # each installed distribution's version, by name


class _Bound(TypedDict):
    format: int
    protocol: ProtocolBinding
    configs: dict[str, str]
    plan: PlanBinding
    trees: dict[str, str]
    code: dict[str, str]
    plugins: dict[str, str]
    exempt: list[str]


class Manifest(_Bound, total=False):
    """The freeze manifest a tag holds (:func:`manifest`; ``commands`` only for command arms)."""

    commands: CommandBindings


def manifest(proto: Protocol, plan_sha: str, runs: int, repo: Path, rev: str = "HEAD") -> Manifest:
    """The freeze manifest of ``proto`` at ``rev`` (the code part is the running code's)."""
    m: Manifest = {
        "format": FORMAT,
        "protocol": {
            "id": proto.spec.id,
            "path": proto.path.resolve().relative_to(repo.resolve()).as_posix(),
            "sha256": proto.sha256,
        },
        "configs": {name: c.sha256 for name, c in sorted(proto.configs.items())},
        "plan": {"sha256": plan_sha, "runs": runs},
        "trees": frozen_entries(repo, rev),
        "code": code_sha256(),
        "plugins": {name: fp["sha256"] for name, fp in proto.plugin_fingerprints().items()},
        "exempt": EXEMPT_LIST,
    }
    if has_commands(proto):
        m["commands"] = command_bindings(proto, repo)
    return m


def has_commands(proto: Protocol) -> bool:
    """Whether a protocol has a study of command arms (its manifest then binds what they run)."""
    return any(st.commands is not None for st in proto.studies)


def command_bindings(proto: Protocol, repo: Path) -> CommandBindings:
    """What a protocol's command arms run besides the frozen trees: each ref's tree (the commit's
    files), the interpreter (``python`` in an argument list is this one) and every installed
    distribution's version."""
    import importlib.metadata as md
    import platform

    refs = refs_of(proto.spec)
    trees: dict[str, str | None] = {}
    for ref in refs:
        got = gitutil.git(repo, "rev-parse", "--verify", "-q", f"{ref}^{{tree}}", check=False)
        trees[ref] = got.stdout.strip() if got.returncode == 0 else None
    packages: dict[str, str] = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name:
            packages[name] = dist.version
    return {
        "refs": trees,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": dict(sorted(packages.items())),
    }


def _python_files(repo: Path, arm: CommandArm) -> list[str] | None:
    """The text of the Python files in a command arm's working directory (its ref's tree, else the
    checkout's tracked files), or None when its program is not this interpreter (what it imports
    cannot be read from its files)."""
    import sys

    if not arm["command"] or arm["command"][0] not in ("python", "python3", sys.executable):
        return None
    cwd = str(arm.get("cwd") or ".")
    ref = arm.get("ref")
    listed = gitutil.git(
        repo, *(["ls-tree", "-r", "--name-only", ref] if ref else ["ls-files"]), "--", cwd, check=False
    ).stdout.split("\n")
    out = []
    for name in (n for n in listed if n.endswith(".py")):
        if ref:
            out.append(gitutil.git(repo, "show", f"{ref}:{name}", check=False).stdout)
        elif (repo / name).is_file():
            out.append((repo / name).read_text(encoding="utf-8", errors="replace"))
    return out


def _top_modules(texts: list[str], argv: list[str]) -> set[str]:
    """The top-level module names the files import (and a ``-m`` module of the command)."""
    import ast

    names = {argv[i + 1].split(".")[0] for i, a in enumerate(argv[:-1]) if a == "-m"}
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


#: How long importing the study's packages to see what they import in turn may take (seconds).
IMPORT_PROBE_S = 300


def loaded_modules(modules: list[str]) -> set[str] | None:
    """The top-level modules that importing ``modules`` (installed packages the study imports) loads
    in this interpreter, in a process of its own: what a package imports without requiring it (torch
    imports numpy, which its metadata does not list). None: the probe did not end or say."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n        __import__(m)\n    except BaseException:\n        pass\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    try:
        got = subprocess.run(
            [sys.executable, "-I", "-c", code],
            capture_output=True,
            text=True,
            timeout=IMPORT_PROBE_S,
            cwd="/",
        )
        names = json.loads(got.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def imported_distributions(proto: Protocol, repo: Path) -> set[str] | None:
    """The installed distributions a protocol's command arms import: the top-level modules the
    Python files of each arm's working directory import, and those that importing them loads in turn
    (:func:`loaded_modules`), the distributions that provide them, and their requirements, closed
    (names as :func:`command_bindings` writes them). None: an arm whose program is not this
    interpreter, or a probe that failed, so every distribution counts."""
    import importlib.metadata as md

    modules: set[str] = set()
    for st in proto.spec.studies:
        if not st.commands:
            continue
        for arm in commands_of(st.arms).values():
            texts = _python_files(repo, arm)
            if texts is None:
                return None
            modules |= _top_modules(texts, arm["command"])
    provides = md.packages_distributions()
    loaded = loaded_modules(sorted(m for m in modules if m in provides))
    if loaded is None:
        return None
    return _required_closure([d for m in sorted(modules | loaded) for d in provides.get(m, [])])


def _required_closure(todo: list[str]) -> set[str]:
    """The distributions named and every installed one they require (extras aside), closed."""
    import importlib.metadata as md
    import re

    seen: set[str] = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:  # a requirement not installed (another platform's, say)
            continue
        seen.add(name)
        todo += [
            m.group(0) for r in requires if "extra ==" not in r and (m := re.match(r"[A-Za-z0-9._-]+", r))
        ]
    return seen


def command_drift(
    then: dict[str, Any] | None, now: CommandBindings | None, only: set[str] | None = None
) -> list[str]:
    """What the command arms would run that differs from the tag's: a ref's tree, the interpreter,
    an installed distribution (added, removed or of another version; of the distributions in
    ``only`` when given: those the study imports, :func:`imported_distributions`)."""
    if then == now:
        return []
    if then is None or now is None:
        return ["command arms: the tag does not bind what they run (tagged before command arms)"]
    out = []
    for ref in sorted(set(then.get("refs", {})) | set(now.get("refs", {}))):
        if then.get("refs", {}).get(ref) != now.get("refs", {}).get(ref):
            out.append(f"ref {ref[:12]}: its tree differs from the tag's (or the commit is missing)")
    if then.get("python") != now.get("python"):
        out.append(f"interpreter: {now.get('python')}, the tag's {then.get('python')}")
    a, b = then.get("packages", {}), now.get("packages", {})
    for name in sorted((set(a) | set(b)) & (only if only is not None else set(a) | set(b))):
        if a.get(name) != b.get(name):
            out.append(
                f"installed package {name}: "
                + (
                    f"{b[name]}, added after the tag"
                    if name not in a
                    else "removed after the tag"
                    if name not in b
                    else f"{b[name]}, the tag's {a[name]}"
                )
            )
    return out


def manifest_sha256(m: Mapping[str, object]) -> str:
    return sha256_bytes(canonical(m))


def tag_message(proto: Protocol, m: Manifest) -> str:
    return (
        f"protocol {proto.spec.id}\nfile {m['protocol']['path']}\nsha256 {proto.sha256}\n"
        f"freeze {manifest_sha256(m)}\n\n{FREEZE_MARKER}\n{json.dumps(m, sort_keys=True, indent=1)}\n"
    )


@dataclass(frozen=True)
class Frozen:
    """What a run of a preregistered protocol records about its freeze."""

    tag: str | None
    tag_commit: str | None
    tag_object: str | None
    tag_created: str | None
    freeze_sha256: str | None

    def as_dict(self) -> dict[str, object]:
        return {
            "tag": self.tag,
            "tag_commit": self.tag_commit,
            "tag_object": self.tag_object,
            "tag_created": self.tag_created,
            "freeze_sha256": self.freeze_sha256,
        }


NOT_FROZEN = Frozen(None, None, None, None, None)


def drift(
    repo: Path, tagged: dict[str, Any], current: Manifest, tag_commit: str, only: set[str] | None = None
) -> list[str]:
    """Every frozen item that differs between the tag's manifest and now, naming paths (of the
    installed distributions, those in ``only`` when given: :func:`imported_distributions`)."""
    out: list[str] = []
    if tagged.get("protocol", {}).get("sha256") != current["protocol"]["sha256"]:
        out.append(f"{current['protocol']['path']}: protocol bytes differ from the tagged file")
    for name, sha in current["configs"].items():
        if tagged.get("configs", {}).get(name) != sha:
            out.append(f"configuration {name}: sha256 {sha[:12]} differs from the tag's")
    if tagged.get("plan") != current["plan"]:
        out.append(
            f"plan: sha256 {current['plan']['sha256'][:12]} ({current['plan']['runs']} runs) differs from the "
            f"tag's (the plan algorithm or its inputs changed)"
        )
    then, now = tagged.get("trees", {}), current["trees"]
    for entry in sorted(set(then) | set(now)):
        if then.get(entry) == now.get(entry):
            continue
        if entry not in then:
            out.append(f"{entry}: added after the tag")
        elif entry not in now:
            out.append(f"{entry}: removed after the tag")
        else:
            changed = gitutil.git(
                repo, "diff", "--name-only", tag_commit, "HEAD", "--", entry, check=False
            ).stdout.split()
            out.extend(f"{p}: changed after the tag" for p in changed) if changed else out.append(
                f"{entry}: changed after the tag"
            )
    for name, sha in current["plugins"].items():
        if tagged.get("plugins", {}).get(name) != sha:
            out.append(f"plug-in {name}: its source differs from the tagged one")
    out.extend(command_drift(tagged.get("commands"), current.get("commands"), only))
    for pkg, sha in current["code"].items():
        if tagged.get("code", {}).get(pkg) != sha:
            out.append(f"the running {pkg} package's source (sha256 {sha[:12]}) differs from the tagged code")
    return out


def _ignorable(path: str) -> bool:
    """An ignored entry that cannot change what runs by itself: bytecode caches (each file is
    checked by :func:`bytecode_problems`) and top-level entries whose names cannot be imported
    (``.venv``, ``.pytest_cache``, ``*.egg-info``)."""
    parts = path.rstrip("/").split("/")
    return "__pycache__" in parts or not parts[0].isidentifier()


def _is_bytecode(path: str) -> bool:
    return "__pycache__" in path.split("/") or path.endswith((".pyc", ".pyo"))


def faithful_cache(pyc: Path) -> bool:
    """Whether ``pyc`` is what this interpreter compiles from its own source file: a cache Python
    wrote, compared code object to code object (``marshal`` of the file against ``compile`` of the
    source), whatever its header says. A cache for another interpreter (another ``cache_tag``) is
    never read by this one and counts as faithful, and so does a stale cache Python would not read
    (:func:`_stale`); a file that is not a cache named for a source file beside its folder (a
    sourceless ``.pyc``, anything else in ``__pycache__``) does not."""
    import importlib.util
    import marshal
    import sys

    parts = pyc.name.split(".")
    if pyc.parent.name != "__pycache__" or len(parts) not in (3, 4) or parts[-1] != "pyc":
        return False
    if parts[1] != sys.implementation.cache_tag:
        return True
    opt = (
        parts[2][4:] if len(parts) == 4 and parts[2].startswith("opt-") else ("" if len(parts) == 3 else None)
    )
    if opt is None or (opt and not opt.isdigit()):
        return False
    source = pyc.parent.parent / f"{parts[0]}.py"
    try:
        data = read_target(str(pyc))
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return False
        if _stale(data, source):
            return True  # Python compiles the source instead of reading this file
        code = marshal.loads(data[16:])
        fresh = compile(
            read_target(str(source)), str(source), "exec", dont_inherit=True, optimize=int(opt or 0)
        )
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        return False
    return bool(code == fresh)


def _stale(data: bytes, source: Path) -> bool:
    """Whether Python, importing ``source``, would not read the cache ``data`` of it: a timestamp
    cache whose recorded mtime or size is not the source's, or a checked-hash cache whose recorded
    hash is not the source's (an unchecked-hash cache is read whatever it records)."""
    import importlib.util

    flags = int.from_bytes(data[4:8], "little")
    if flags == 0:
        st = source.stat()
        return data[8:12] != (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") or data[12:16] != (
            st.st_size & 0xFFFFFFFF
        ).to_bytes(4, "little")
    if flags == 3:
        return data[8:16] != importlib.util.source_hash(read_target(str(source)))
    return False


def bytecode_problems(repo: Path) -> list[str]:
    """Bytecode inside the frozen entries that could run instead of the tagged source, each named:
    any tracked ``.pyc`` or file under ``__pycache__`` (the freeze binds source, never bytecode),
    and any untracked or ignored one that is not a faithful cache of its own source file
    (:func:`faithful_cache`): an unchecked-hash or timestamp ``.pyc`` whose header matches the
    source while its code does not is imported by Python without looking at the source. The
    harness writes none (``sys.dont_write_bytecode``, ``python -B``, ``PYTHONDONTWRITEBYTECODE``)."""
    out = []
    tracked = set(gitutil.git(repo, "ls-files", "-z", check=False).stdout.split("\0"))
    for path in sorted(p for p in tracked if p and not exempt(p.split("/", 1)[0]) and _is_bytecode(p)):
        out.append(
            f"{path}: bytecode tracked in a frozen folder (the freeze binds source, and Python can import "
            f"this file instead of it): git rm --cached {path}, then commit"
        )
    for entry in sorted(os.listdir(repo)):
        if exempt(entry) or not entry.isidentifier() or not (repo / entry).is_dir():
            continue
        for top, dirs, files in os.walk(repo / entry):
            dirs.sort()
            for name in sorted(files):
                full = Path(top) / name
                rel = full.relative_to(repo).as_posix()
                if _is_bytecode(rel) and rel not in tracked and not faithful_cache(full):
                    out.append(
                        f"{rel}: bytecode in a frozen folder that is not the compilation of its own "
                        f"source (planted, or left by another tool); Python could run it instead of the "
                        f"source: remove it (rm {rel})"
                    )
    return out


def uncommitted(repo: Path) -> list[str]:
    """Uncommitted changes, untracked files and ignored files anywhere outside the exempt entries.

    An ignored file inside a frozen entry (a ``yaml/`` package next to the code after an edit of the
    exempt ``.gitignore``, a planted module) could be imported like a tracked one, so it is refused
    like an untracked one; only :func:`_ignorable` ones are not."""
    r = gitutil.git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored=matching", check=False)
    out = []
    for line in r.stdout.splitlines():
        state, path = line[:2], line[3:]
        if " -> " in path:  # a rename names both sides
            path = path.split(" -> ", 1)[1]
        if exempt(path.strip('"').split("/", 1)[0]):
            continue
        if state == "!!":
            if not _ignorable(path.strip('"')):
                out.append(
                    f"{path}: ignored by .gitignore but inside a frozen entry (an ignored file can be imported "
                    "like a tracked one: remove it, or move it to an exempt folder)"
                )
            continue
        out.append(f"{path}: {'untracked' if state == '??' else 'uncommitted change'}")
    # git status does not look at a file marked skip-worktree or assume-unchanged: an edit to it would
    # run unseen, so such a mark on a frozen file is refused like the change it can hide
    flags = gitutil.git(repo, "ls-files", "-v", check=False)
    for line in flags.stdout.splitlines():
        flag, path = line[:1], line[2:]
        if (flag == "S" or flag.islower()) and not exempt(path.strip('"').split("/", 1)[0]):
            mark = "skip-worktree" if flag in ("S", "s") else "assume-unchanged"
            out.append(
                f"{path}: marked {mark} in git's index, so git cannot see an edit to it (git update-index "
                f"--no-{mark} {path})"
            )
    return out


def worktree_mismatches(repo: Path, rev: str) -> list[str]:
    """Every tracked file of the frozen entries whose bytes on disk are not ``rev``'s blob, compared
    directly (git's blob id of the raw bytes), not through ``git status``: a clean filter, ``ident``
    or a line-ending conversion in the repository's attributes (``.gitattributes``,
    ``.git/info/attributes``) or config makes ``git status`` and ``git diff`` call an edited file
    clean, and the edit would run."""
    fmt = gitutil.object_format(repo)
    out = []
    for path, (mode, oid) in sorted(gitutil.tree_files(repo, rev).items()):
        if exempt(path.split("/", 1)[0]) or mode == "160000":  # a submodule is a commit, not bytes
            continue
        got = gitutil.disk_blob_id(repo / path, mode, fmt)
        if got is None:
            out.append(f"{path}: tracked at {rev[:12]} but not readable in the working tree")
        elif got != oid:
            out.append(
                f"{path}: its bytes on disk are not the committed blob although git may call it clean "
                "(a filter, ident or line-ending conversion in the repository's attributes or config "
                "hides the edit); restore it: git checkout -- " + path
            )
    return out


def sources_mismatches(repo: Path, rev: str, sources: dict[str, dict[str, str]]) -> list[str]:
    """The sources a worker may import (:func:`harness.execute.launchers.source_hashes`, read once)
    that lie in ``repo`` and are not byte for byte ``rev``'s blobs: what the workers are checked
    against is then what was committed (and, for a preregistered study, tagged)."""
    tree = gitutil.tree_files(repo, rev)
    top = repo.resolve()
    want: dict[str, str] = {}
    for root, files in sources.items():
        for rel, sha in files.items():
            try:
                want[(Path(root) / rel).relative_to(top).as_posix()] = sha
            except ValueError:  # outside this repository (an installed harness: its code hash is checked)
                continue
    out = [
        f"{p}: a source file the workers could import is not tracked at {rev[:12]}"
        for p in want
        if p not in tree
    ]
    got = gitutil.blobs(repo, sorted({tree[p][1] for p in want if p in tree}))
    for path, sha in sorted(want.items()):
        if path in tree and sha256_bytes(got.get(tree[path][1], b"")) != sha:
            out.append(
                f"{path}: the bytes read for the workers are not the committed blob (changed during the check)"
            )
    return out


def calibration_step(proto: Protocol) -> str:
    """The next step for a protocol whose calibration is pending: its pilot and calibration command."""
    cal = proto.spec.calibration or {}
    return (
        f"first run its pilot and calibration: {cal.get('command') or 'harness run ' + str(cal.get('pilot'))}; "
        f"then write the numbers into {proto.relpath}, set calibration status: done, commit, and run: "
        f"harness tag {proto.relpath}"
    )


def restore_tag(proto: Protocol) -> str | None:
    """A published study's tag, restored in a clone (which fetches no tags) from the tag object its
    records folder keeps (``TAG``), when that object names this protocol's tag, a commit of this
    repository, and is the object every record names; returns what was done, or None. The restored
    tag is the original, byte for byte (same object id, same signature): no new tag is made."""
    if not proto.spec.preregistered:
        return None
    repo = gitutil.toplevel(proto.path)
    kept = proto.records_path / "TAG"
    if (
        repo is None
        or file_problem(str(kept), 1 << 20)
        or gitutil.tag_info(repo, proto.spec.tag_name) is not None
    ):
        return None
    raw = read_regular(str(kept), 1 << 20)
    head = raw.split(b"\n\n", 1)[0].decode("utf-8", "replace").splitlines()
    fields = dict(line.split(" ", 1) for line in head if " " in line)
    if fields.get("tag") != proto.spec.tag_name or fields.get("type") != "commit":
        return None
    if gitutil.git(repo, "cat-file", "-e", f"{fields.get('object', '')}^{{commit}}", check=False).returncode:
        return None
    named = set()
    for f in proto.records_path.glob("*.record.json"):
        try:  # bounded: a link or a FIFO named as a record is not opened
            named.add(read_json(str(f))["protocol"].get("tag_object"))  # type: ignore[index]
        except (KeyError, TypeError, AttributeError):
            continue
    made = gitutil.git_bytes_in(repo, ["mktag"], raw)
    if made is None or named != {made}:
        return None
    if gitutil.git(repo, "update-ref", f"refs/tags/{proto.spec.tag_name}", made, "", check=False).returncode:
        return None  # the ref could not be written: the freeze check then names the missing tag
    rel = proto.records_path.relative_to(proto.root).as_posix()
    return (
        f"restored tag {proto.spec.tag_name} from {rel}/TAG (object {made[:12]}, the one its records name): "
        f"this study is published; its records are in {rel}, audited by: python analysis/public_audit.py {rel}"
    )


def _preregistered_at(proto: Protocol) -> str:
    """Where the protocol says it is not preregistered: its file, key and line (or the default)."""
    from prereg.protocol.read import read_document

    line = read_document(proto.path).lines.get(("preregistered",))
    if line is None:
        return f"{proto.path}: key preregistered is not set (default false)"
    return f"{proto.path}:{line}, key preregistered: false"


def _refuse_tag_of_unpreregistered(proto: Protocol) -> None:
    """Refuse a protocol that is not preregistered while a tag of its id exists: the audit reads any
    tag ``protocol-<id>`` as the study's definition, so records run untagged would all fail it."""
    repo = gitutil.toplevel(proto.path)
    if repo is None or gitutil.tag_info(repo, proto.spec.tag_name) is None:
        return
    raise RefusedError(
        f"{_preregistered_at(proto)}, but tag {proto.spec.tag_name} exists, and the audit binds records to "
        "any tag of the id; to run it, either set preregistered: true (the tag then binds it), or, "
        f"if that tag is not a published preregistration, delete it (git tag -d {proto.spec.tag_name}), or "
        "give this protocol a new id; nothing was run"
    )


def check(proto: Protocol, plan_sha: str, runs: int) -> Frozen:
    """For a preregistered protocol: refuse unless everything frozen at the tag is unchanged.

    Refuses (naming every differing path) when the tag is missing or lightweight, holds no freeze
    manifest, is not an ancestor of HEAD, or when the protocol, a configuration, the plan, a frozen
    folder or the running code differ from the tag, or when the frozen folders have uncommitted
    changes or untracked files. Returns what the records say about the freeze.
    """
    if not proto.spec.preregistered:
        _refuse_tag_of_unpreregistered(proto)
        return NOT_FROZEN
    repo = gitutil.toplevel(proto.path)
    if repo is None:
        raise RefusedError(
            f"{proto.path}: not inside a git repository; a preregistered protocol must be committed "
            "and tagged"
        )
    how = f"to run a changed experiment, copy {proto.relpath} to a new protocol id, commit it and run: harness tag"
    info, tagged = _tag_and_manifest(proto, repo, how)
    rel = proto.relpath
    blob = gitutil.blob_at(repo, info.commit, rel)
    if blob is None or sha256_bytes(blob) != proto.sha256:
        raise RefusedError(
            f"{proto.path}: the file's bytes differ from the tagged protocol ({proto.spec.tag_name} at "
            f"{info.commit[:12]}); a frozen protocol cannot change: {how}"
        )
    if not gitutil.is_ancestor(repo, info.commit):
        raise RefusedError(
            f"{proto.spec.tag_name} ({info.commit[:12]}) is not an ancestor of HEAD; check out the study's history"
        )
    current = manifest(proto, plan_sha, runs, repo)
    only = imported_distributions(proto, repo) if has_commands(proto) else None
    problems = drift(repo, tagged, current, info.commit, only)
    problems += uncommitted(repo)
    problems += worktree_mismatches(repo, info.commit)
    problems += bytecode_problems(repo)
    if problems:
        raise RefusedError(
            f"{proto.path}: the experiment frozen by {proto.spec.tag_name} ({info.commit[:12]}) has drifted; nothing was "
            "run:\n" + "\n".join(f"  - {p}" for p in problems) + f"\n{how}"
        )
    return Frozen(info.name, info.commit, info.object, info.created, manifest_sha256(tagged))


def _tag_and_manifest(proto: Protocol, repo: Path, how: str) -> tuple[gitutil.TagInfo, dict[str, Any]]:
    """The study's tag and the freeze manifest it holds; refuses a missing or lightweight tag, one
    holding no freeze manifest, or one of another format (``how``: how to run a changed experiment)."""
    info = gitutil.tag_info(repo, proto.spec.tag_name)
    if info is None:
        if proto.calibration_pending:
            raise RefusedError(
                f"{proto.path}: preregistered protocol {proto.spec.id!r} has no tag {proto.spec.tag_name}, and "
                f"its calibration is pending; {calibration_step(proto)}"
            )
        raise RefusedError(
            f"{proto.path}: preregistered protocol {proto.spec.id!r} has no tag {proto.spec.tag_name}; "
            f"commit it and run: harness tag {proto.path}"
        )
    if not info.annotated:
        raise RefusedError(
            f"{proto.spec.tag_name} is a lightweight tag; only `harness tag` (an annotated tag holding "
            f"the freeze manifest) freezes a protocol: delete it and run: harness tag {proto.path}"
        )
    tagged = parse_manifest(info.message)
    if tagged is None:
        raise RefusedError(
            f"{proto.spec.tag_name} holds no freeze manifest (it was not made by this harness's "
            f"`harness tag`); {how}"
        )
    if tagged.get("format") != FORMAT:
        raise RefusedError(
            f"{proto.spec.tag_name}: freeze manifest format {tagged.get('format')!r}; this harness reads "
            f"format {FORMAT} (run the harness version that tagged it, or {how})"
        )
    return info, tagged


def tag(proto: Protocol, sign: bool = False) -> tuple[gitutil.TagInfo, Manifest]:
    """Create the annotated tag ``protocol-<id>`` on HEAD, holding the freeze manifest (signed by
    git with ``sign``).

    Refuses a pending calibration, an uncommitted protocol file, uncommitted changes or untracked
    files in the frozen entries, an existing tag, and existing records.
    """
    from harness.plan import make_plan, plan_sha256
    from prereg.formats.record import record_files

    repo = gitutil.toplevel(proto.path)
    if repo is None:
        raise RefusedError(f"{proto.path}: not inside a git repository; commit the protocol, then tag it")
    if not proto.spec.preregistered:
        raise RefusedError(
            f"{_preregistered_at(proto)}: a tag freezes a preregistered protocol, and the audit binds "
            f"records to any tag {proto.spec.tag_name}; set preregistered: true, commit, and tag it (or run "
            "it untagged: a protocol that is not preregistered needs no tag); nothing was tagged"
        )
    rel = proto.relpath
    if proto.calibration_pending:
        raise RefusedError(f"{proto.path}: calibration is pending; {calibration_step(proto)}")
    state = gitutil.file_state(repo, rel)
    if state != "clean":
        raise RefusedError(f"{proto.path}: the protocol file is {state}; commit it before tagging")
    if gitutil.tag_info(repo, proto.spec.tag_name) is not None:
        raise RefusedError(
            f"tag {proto.spec.tag_name} already exists; a protocol is frozen once (use a new id)"
        )
    if record_files(proto.records_path):
        raise RefusedError(f"records already exist in {proto.records_path}; a tag must precede every outcome")
    runs = make_plan(proto)
    m = manifest(proto, plan_sha256(runs), len(runs), repo)
    dirty = uncommitted(repo) + worktree_mismatches(repo, "HEAD") + bytecode_problems(repo)
    if dirty:
        raise RefusedError(
            f"{proto.path}: the frozen folders have changes that are not committed; commit or remove "
            "them before tagging:\n" + "\n".join(f"  - {p}" for p in dirty)
        )
    gitutil.create_tag(repo, proto.spec.tag_name, tag_message(proto, m), sign=sign)
    info = gitutil.tag_info(repo, proto.spec.tag_name)
    if info is None:  # pragma: no cover - git just created it
        raise RefusedError(f"git did not create {proto.spec.tag_name}")
    return info, m


def exempt_imports(root: Path, sources: list[Path]) -> list[str]:
    """Imports in frozen ``sources`` (plug-ins) of modules that lie in an exempt entry of ``root``
    (``benchmarks/``, ``tests/``): such a helper could change after the tag without drifting."""
    import ast

    out = []
    for src in sources:
        try:
            tree = ast.parse(read_target(str(src)), filename=str(src))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0]
                if exempt(top) and ((root / top).is_dir() or (root / f"{top}.py").is_file()):
                    rel = (
                        src.resolve().relative_to(root.resolve())
                        if src.resolve().is_relative_to(root.resolve())
                        else src
                    )
                    out.append(
                        f"{rel}:{node.lineno}: imports {name}, which lies in {top}/, exempt from the freeze"
                    )
    return out


def sealed_plots(directory: Path) -> dict[str, str]:
    """The records folder's PNG plots (:data:`prereg.tag.PLOT_FILES`) by name, each file's sha256:
    what the signed result head seals, so a replaced plot fails the audit."""
    return {
        n: sha256_bytes(read_regular(str(directory / n)))
        for n in sorted(PLOT_FILES)
        if (directory / n).is_file()
    }


def sign_result(proto: Protocol, seq: int, sha: str, seal_plots: bool = False) -> str:
    """Sign the study's ledger head: a signed annotated tag ``result-<id>`` on the protocol tag's
    commit whose message names the protocol, the freeze manifest's sha256 and the head
    (:func:`prereg.tag.result_message`), made by git's own signing as ``harness tag --sign`` makes
    the protocol tag (``gpg.format ssh``, ``user.signingkey``); its raw bytes are kept as
    ``RESULT`` in the records folder, so a clone without tags carries it. A later head (a resumed
    study) replaces both. With ``seal_plots`` (once the report has drawn them) the head also seals
    the folder's PNG plots (:func:`sealed_plots`), and a head signed without them is signed again. The audit verifies it with the reader's ``--allowed-signers``, so the
    reader needs no head published elsewhere. Returns what was done."""
    repo = gitutil.toplevel(proto.path)
    info = gitutil.tag_info(repo, proto.spec.tag_name) if repo is not None else None
    m = parse_manifest(info.message) if info is not None else None
    if repo is None or info is None or m is None:
        raise RefusedError(f"{proto.path}: no protocol tag {proto.spec.tag_name} to sign a result of")
    name = f"result-{proto.spec.id}"
    kept = proto.records_path / RESULT_FILE
    try:
        kept_raw = read_present(str(kept), 1 << 20)
    except InputLimitError as e:
        raise RefusedError(f"{e}: harness report --sign keeps the signed head there as a regular file") from e
    old = parse_result(kept_raw) if kept_raw is not None else None
    plots = sealed_plots(proto.records_path) if seal_plots else None  # after the report drew them
    if (
        old is not None
        and (old["seq"], old["sha256"], old["plots"]) == (seq, sha, plots)
        and gitutil.tag_info(repo, name)
    ):
        return f"the ledger head seq {seq} is already signed as tag {name} ({kept})"
    message = result_message(proto.spec.id, manifest_sha256(m), seq, sha, plots)
    gitutil.create_tag(repo, name, message, sign=True, target=info.commit, force=True)
    raw = gitutil.tag_object(repo, f"refs/tags/{name}")
    if raw is None:  # pragma: no cover - git just created it
        raise RefusedError(f"git did not create {name}")
    from prereg.files import atomic_write

    atomic_write(kept, raw, overwrite=True)
    return (
        f"signed the ledger head seq {seq} sha256 {sha} as tag {name} (kept as "
        f"{proto.records_path / RESULT_FILE}; commit it with the records and push the tag)"
    )
