"""Trust from outside the records: the tag's SSH signature against the reader's allowed-signers file,
and the ledger heads anchored in a remote's ``refs/ledger/protocol-<id>``."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from prereg.bounded import InputLimitError, file_problem, read_present
from prereg.files import atomic_write
from prereg.tag import ANCHOR_PROTOCOLS, Truth

ANCHOR_REF = "refs/ledger/"  # + protocol-<id>: the anchor commits `harness run --anchor` pushes


#: The lines that open a signature block in a git tag object (git's gpg-interface.c); the last
#: such line begins the signature, what precedes it is the signed payload.
SIG_STARTS = {
    "-----BEGIN SSH SIGNATURE-----": "SSH",
    "-----BEGIN PGP SIGNATURE-----": "OpenPGP",
    "-----BEGIN PGP MESSAGE-----": "OpenPGP",
    "-----BEGIN SIGNED MESSAGE-----": "X.509",
}


def _isolated_env() -> dict[str, str]:
    """An environment in which git and ssh-keygen read no system, global or inherited configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {
        **env,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": ":".join(ANCHOR_PROTOCOLS),  # no remote helper (fd::, ext::, ...)
    }


def split_signature(raw: bytes) -> tuple[bytes, bytes, str | None]:
    """A tag object's signed payload, its signature block and the block's kind (None: unsigned)."""
    pos, start, kind = 0, len(raw), None
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        end = len(raw) if nl < 0 else nl + 1
        line = raw[pos:end].rstrip(b"\r\n").decode("utf-8", "replace")
        for head, name in SIG_STARTS.items():
            if line.startswith(head):
                start, kind = pos, name
        pos = end
    return raw[:start], raw[start:], kind


def _ssh_keygen(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["ssh-keygen", *args], input=stdin, capture_output=True, check=False, env=_isolated_env()
    )


def check_signature(root: str, truth: Truth, signers: str | None) -> tuple[list[str], str]:
    """With an allowed-signers file given by the reader, the tag object must carry an SSH signature
    (``-----BEGIN SSH SIGNATURE-----``) that ``ssh-keygen -Y verify`` (namespace ``git``, as git
    signs) accepts for a principal of that file. Neither git nor the audited repository's
    configuration takes part, and an OpenPGP or X.509 signature is refused: the reader's keyring
    is not the reader's allowed-signers file."""
    if not truth.get("tagged"):
        return [], "no tag"
    if signers is None:
        return [], (
            "signed, not verified (pass --allowed-signers FILE)" if truth.get("signed") else "not signed"
        )
    if not truth.get("signed"):
        return [
            f"tag {truth['tag']} is not signed; --allowed-signers needs a tag made by harness tag --sign"
        ], "unsigned"
    tag = truth["tag"]
    payload, sig, kind = split_signature(truth.get("tag_raw") or b"")
    if kind != "SSH":
        what = f"an {kind} signature" if kind else "no signature block git recognises"
        return [
            f"tag {tag}: the tag object carries {what}, not an SSH signature "
            f"(-----BEGIN SSH SIGNATURE-----); --allowed-signers {signers} verifies SSH signatures "
            "only"
        ], "not an SSH signature"
    who, why = _signer(signers, payload, sig)
    if who is not None:
        bound = _bound_signers(root, truth, payload, sig)
        if bound:
            return [f"tag {tag}: {bound}"], f"signed by {who} (yours), not by a key its commit lists"
        return [], f"good SSH signature by {who} (key {key_fingerprint(sig)}), allowed by {signers}"
    return [f"tag {tag}: its signature does not verify against {signers} ({why})"], "bad signature"


def key_fingerprint(sig: bytes) -> str:
    """The fingerprint (``SHA256:...``, as ``ssh-keygen -l`` prints it) of the public key an armored
    SSH signature ``sig`` carries (PROTOCOL.sshsig: ``SSHSIG``, a version, then the key as a
    string), or ``"an unreadable key"``: what the reader compares with the fingerprint of the
    maintainers' key they hold from outside (their README, a key server, a code host's keys)."""
    import base64
    import binascii
    import hashlib

    lines = sig.decode("ascii", "replace").strip().splitlines()
    try:
        blob = base64.b64decode("".join(x for x in lines if not x.startswith("-----")), validate=True)
    except (binascii.Error, ValueError):
        return "an unreadable key"
    n = int.from_bytes(blob[10:14], "big") if blob[:6] == b"SSHSIG" and len(blob) >= 14 else -1
    if n <= 0 or len(blob) < 14 + n:
        return "an unreadable key"
    digest = base64.b64encode(hashlib.sha256(blob[14 : 14 + n]).digest()).decode("ascii")
    return "SHA256:" + digest.rstrip("=")


def _signer(signers: str, payload: bytes, sig: bytes) -> tuple[str | None, str]:
    """The principal of the allowed-signers file ``signers`` whose key made the SSH signature
    ``sig`` over ``payload`` (namespace ``git``, as git signs), or None and why not."""
    import tempfile

    allowed = os.path.abspath(signers)
    with tempfile.TemporaryDirectory(prefix="audit-sig-") as tmp:
        sig_path = os.path.join(tmp, "object.sig")
        atomic_write(Path(sig_path), sig, overwrite=True, sync=False)
        try:
            found = _ssh_keygen(["-Y", "find-principals", "-f", allowed, "-s", sig_path], b"")
            principals = found.stdout.decode("utf-8", "replace").split() if found.returncode == 0 else []
            why = (
                found.stderr.decode("utf-8", "replace").strip().splitlines()
                or ["no principal matches its key"]
            )[-1]
            for who in principals:
                r = _ssh_keygen(
                    ["-Y", "verify", "-f", allowed, "-I", who, "-n", "git", "-s", sig_path], payload
                )
                if r.returncode == 0:
                    return who, ""
                why = (r.stderr.decode("utf-8", "replace").strip().splitlines() or ["no detail"])[-1]
        except OSError as e:
            return None, f"ssh-keygen could not run to verify it: {e}"
    return None, why


def check_result(
    root: str, directory: str, truth: Truth, entries: list[dict[str, Any]], signers: str | None
) -> tuple[list[str], str, str | None]:
    """The signed result head (``harness.freeze.sign_result``): the tag object ``result-<id>``
    kept as ``RESULT`` in the records folder (or, without the file, the ref). It must name this
    protocol, the tag's freeze manifest and a head the chain holds at its seq; with the reader's
    ``--allowed-signers`` its SSH signature must verify. Returns problems, a description, and why
    the chain's head is *not* vouched for by the reader's keys (None: it is)."""
    from prereg.tag import parse_result

    pid = truth.get("summary", {}).get("id")
    try:
        raw, where = _result_tag(root, directory, pid)
    except InputLimitError as e:
        return [f"{e}"], "unreadable", "its signed result head is unreadable"
    if raw is None:
        return (
            [],
            "no signed result head",
            (
                "no signed result head (harness report --sign); a head published elsewhere can be checked "
                "with --head, but only the maintainers' signature vouches for it"
            ),
        )
    payload, sig, kind = split_signature(raw)
    got = parse_result(payload)
    if got is None or got["protocol"] != pid or got["tag"] != f"result-{pid}":
        return (
            [f"{where}: not a result tag of protocol-{pid} (harness report --sign writes one)"],
            ("unreadable"),
            "its signed result head is unreadable",
        )
    seq, sha = got["seq"], got["sha256"]
    problems = []
    if got["freeze"] != truth.get("freeze"):
        problems.append(f"{where}: freeze {str(got['freeze'])[:16]} is not the tag's freeze manifest")
    held = {e["ledger"]["seq"]: e["sha256"] for e in entries if isinstance(e.get("ledger"), dict)}
    if held.get(seq) != sha:
        problems.append(
            f"{where}: the signed result head seq {seq} sha256 {sha[:16]}: the records hold "
            f"{str(held.get(seq, 'no entry'))[:16]} there: history was rewritten after it was signed"
        )
    problems += plot_problems(directory, got["plots"], where, got.get("plots_said"))
    return _result_signature(problems, where, seq, max(held, default=0), signers, payload, sig, kind)


def plot_problems(
    directory: str, plots: dict[str, str] | None, where: str, said: str | None = None
) -> list[str]:
    """Each PNG plot of the folder against the signed result head that seals them (``plot NAME
    SHA256`` lines, :func:`prereg.tag.result_message`): one replaced, added or removed is named, and
    a head whose ``plots N`` line (``said``) is not the number of plots it seals. A head signed
    before plots were sealed (``plots`` None) checks none (the folder's row names them, not verified)."""
    from prereg.tag import PLOT_FILES

    if plots is None:
        return []
    out = []
    if said is not None and said != str(len(plots)):
        out.append(
            f"{where}: says plots {said}, but seals {len(plots)} plot line(s) it can read: the sealed "
            "plots are not the ones the head counts"
        )
    for name in sorted(PLOT_FILES | set(plots)):
        path = os.path.join(directory, name)
        try:
            raw = read_present(path, 64 << 20)
        except InputLimitError as e:
            out.append(f"{e}")
            continue
        if raw is None and name in plots:
            out.append(f"{path}: missing; {where} seals it (sha256 {plots[name][:16]})")
        elif raw is not None and name not in plots:
            out.append(f"{path}: a plot {where} does not seal (drawn or added after the head was signed)")
        elif raw is not None and hashlib.sha256(raw).hexdigest() != plots[name]:
            out.append(
                f"{path}: sha256 {hashlib.sha256(raw).hexdigest()[:16]}; {where} seals {plots[name][:16]}: "
                "the plot was replaced after the head was signed"
            )
    return out


def _result_tag(root: str, directory: str, pid: object) -> tuple[bytes | None, str]:
    """The result tag's bytes (None where there is none) and where they were read: the records
    folder's ``RESULT`` file or, without it, the ref ``result-<id>``."""
    from prereg.tag import RESULT_FILE, git_bytes

    path = os.path.join(directory, RESULT_FILE)
    raw = read_present(path, 1 << 20)  # a link, a FIFO, a pseudo-file: InputLimitError, never read
    if raw is not None:
        return raw, path
    return git_bytes(root, "cat-file", "tag", f"refs/tags/result-{pid}"), f"tag result-{pid}"


def _result_signature(
    problems: list[str],
    where: str,
    seq: int,
    last: int,
    signers: str | None,
    payload: bytes,
    sig: bytes,
    kind: str | None,
) -> tuple[list[str], str, str | None]:
    """:func:`check_result`'s verdict on the result head at ``seq`` of a chain ending at ``last``,
    from its signature checked against the reader's ``signers`` (``problems``: those found so far)."""
    what = f"seq {seq} of {last}"
    if signers is None:
        return (
            problems,
            f"{what}, signed, not verified (pass --allowed-signers FILE)",
            ("the signed result head is not verified (pass --allowed-signers FILE)"),
        )
    if kind != "SSH":
        return problems + [f"{where}: carries no SSH signature"], what, "the result head is not signed"
    who, why = _signer(signers, payload, sig)
    if who is None:
        return (
            problems + [f"{where}: its signature does not verify against {signers} ({why})"],
            what,
            ("the result head's signature does not verify"),
        )
    if seq != last:
        return (
            problems,
            f"{what}, good SSH signature by {who} (key {key_fingerprint(sig)})",
            (
                f"the signed result head is seq {seq}, but the chain goes on to seq {last}: the entries after "
                "it are vouched for by nobody"
            ),
        )
    return (
        problems,
        f"{what} (the chain's head), good SSH signature by {who} (key {key_fingerprint(sig)}), allowed by {signers}",
        None,
    )


#: The repository's allowed-signers file: the copy in the tagged commit is what the tag binds.
SIGNERS_PATH = "protocols/allowed_signers"
#: The most bytes of an allowed-signers file read (a line per key: a few hundred bytes each).
SIGNERS_LIMIT = 1 << 20


def signers_problem(signers: str) -> str | None:
    """Why the reader's allowed-signers file ``signers`` is not given to ``ssh-keygen`` (its target,
    where it is a link, is not a regular file of at most :data:`SIGNERS_LIMIT` bytes: a FIFO would
    hang it, ``/dev/zero`` never end), or None."""
    return file_problem(os.path.realpath(signers), SIGNERS_LIMIT)


def _bound_signers(root: str, truth: Truth, payload: bytes, sig: bytes) -> str | None:
    """Why the tag's signature is not by a key that ``protocols/allowed_signers`` *of the tagged
    commit* lists (None when it is, or when that commit has no such file). The tag names its
    commit and the commit its tree, so that copy is bound at the tag: a tag re-signed with another
    key over the same message, with the working tree's file swapped, is named here."""
    from prereg.tag import git_bytes

    commit = truth.get("commit")
    data = git_bytes(root, "cat-file", "blob", f"{commit}:{SIGNERS_PATH}") if commit else None
    if data is None:
        return None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="audit-bound-") as tmp:
        path = os.path.join(tmp, "bound_signers")
        atomic_write(Path(path), data, overwrite=True, sync=False)
        if _signer(path, payload, sig)[0] is not None:
            return None
    return (
        f"its signature is by a key that {SIGNERS_PATH} of the tagged commit {str(commit)[:12]} does "
        "not list: the tag was signed again by another key (or the file bound at the tag never named "
        "the signer)"
    )


def signers_kept(root: str, truth: Truth) -> list[str]:
    """``protocols/allowed_signers`` may gain keys after a tag (it is exempt from the freeze, so a
    later study can add its key) but must keep every line the tagged commit's copy holds: a key
    removed or replaced since is named."""
    from prereg.tag import git_bytes

    commit = truth.get("commit")
    data = git_bytes(root, "cat-file", "blob", f"{commit}:{SIGNERS_PATH}") if commit else None
    if data is None:
        return []
    try:
        now = set((read_present(os.path.join(root, SIGNERS_PATH), SIGNERS_LIMIT) or b"").splitlines())
    except InputLimitError as e:
        return [f"{e} (the signers file bound at the tag {str(commit)[:12]} is a regular file)"]
    gone = [line for line in data.splitlines() if line.strip() and line not in now]
    if not gone:
        return []
    return [
        f"{SIGNERS_PATH}: {len(gone)} line(s) of the copy bound at the tag ({str(commit)[:12]}) are no "
        "longer in the file (a key removed or replaced after the tag; keys may only be added)"
    ]


def roots_from_repository(
    dirs: list[str], signers: str | None, published: tuple[int, str] | None
) -> list[str]:
    """The trust roots the reader passed that came from the repository being audited, and so prove
    nothing against whoever rewrote it: an ``--allowed-signers`` file inside its work tree, or a
    ``--head`` that a tracked file outside the records folders prints (the README, a doc). A head
    the records folder itself holds (its entries, MANIFEST, its report and page) is not counted: it
    is the value being checked. A signers file outside it is not judged by its bytes (a copy of the
    maintainers' published file is what an honest reader holds): the fingerprint of each key that
    verified is printed (:func:`key_fingerprint`) for the reader to compare with the one they hold."""
    from prereg.tag import git_out, git_root

    out: list[str] = []
    seen: set[str] = set()
    for d in dirs:
        top = git_root(d)
        if top is None or top in seen:
            continue
        seen.add(top)
        real = os.path.realpath(top)
        if signers is not None:
            where = os.path.realpath(signers)
            if where == real or where.startswith(real + os.sep):
                out.append(
                    f"--allowed-signers {signers} lies inside {top}, the repository being audited: "
                    "whoever rewrote the records could rewrite it too"
                )
        if published is not None:
            listed = git_out(top, "grep", "-l", "-F", "-e", published[1]) or ""
            printed = []
            for rel in listed.splitlines():
                folder = os.path.dirname(os.path.join(top, rel))
                if not os.path.isfile(os.path.join(folder, "MANIFEST")):
                    printed.append(rel)
            if printed:
                out.append(
                    f"--head {published[0]}:{published[1][:16]}... is printed in {', '.join(printed)} of "
                    f"{top}, the repository being audited: a head copied from there proves nothing (take "
                    "it from where it was published outside the repository)"
                )
    return out


def check_anchor(
    root: str,
    truth: Truth,
    records: list[dict[str, Any]],
    remote: str,
    times: list[tuple[int, str]] | None = None,
) -> tuple[list[str], str, int]:
    """Every head anchored in ``remote``'s ``refs/ledger/protocol-<id>`` history is in the chain, in
    order: every commit reachable from the ref along any parent is read (none is skipped as a
    second parent), each must hold a ledger head the records hold at its seq, and none may be a
    merge (docs/provenance.md, "Anchors"). Returns problems, a description and the highest anchored
    seq; ``times``, when given, receives each anchored head's seq and its anchor commit's time."""
    pid = truth.get("summary", {}).get("id") or records[0]["protocol"].get("id")
    ref = f"{ANCHOR_REF}protocol-{pid}"
    log, url = fetch_anchor(remote, ref)
    if log is None:
        return [f"anchor {remote}: cannot fetch {ref} from {url}"], "not fetched", 0
    by_seq: dict[int, str] = {}
    for r in records:
        if "ledger" in r:
            by_seq.setdefault(r["ledger"]["seq"], r["sha256"])
    out, heads = [], []
    for entry in log.split("\x01"):
        if not entry.strip():
            continue
        commit, parents, when, body = entry.strip("\n").split("\x00", 3)
        if len(parents.split()) > 1:
            out.append(
                f"anchor {commit[:12]} ({when}): a merge of {len(parents.split())} parents "
                f"({', '.join(x[:12] for x in parents.split())}); the anchor history is a line of "
                "single-parent commits (harness run --anchor pushes nothing else), and a merge can put a "
                "forged history in front of the real one"
            )
        fields = dict(line.split(" ", 1) for line in body.splitlines() if " " in line)
        try:
            heads.append((int(fields["seq"]), fields["sha256"], fields.get("freeze"), commit, when))
        except (KeyError, ValueError):
            out.append(f"anchor {commit[:12]}: not a ledger head")
    heads.reverse()  # oldest first
    if times is not None:
        times.extend((seq, when) for seq, _s, _f, _c, when in heads)
    last = 0
    for seq, sha, freeze, commit, when in heads:
        if truth.get("freeze") and freeze != truth["freeze"]:
            out.append(f"anchor {commit[:12]} ({when}): freeze {str(freeze)[:16]} is not the tag's")
        if seq < last:
            out.append(
                f"anchor {commit[:12]} ({when}): seq {seq} after an anchored seq {last}: the chain "
                "was cut back"
            )
        got = by_seq.get(seq)
        if got != sha:
            out.append(
                f"anchored head seq {seq} sha256 {sha[:16]} (anchor {commit[:12]}, {when}): the "
                f"records hold {got[:16] if got else 'no record'} there: history was rewritten after "
                "it was anchored"
            )
        last = max(last, seq)
    n = max(by_seq, default=0)
    return out, f"{len(heads)} anchored heads in {ref} fetched from {url}, up to seq {last} of {n}", last


def fetch_anchor(remote: str, ref: str) -> tuple[str | None, str]:
    """The log of ``ref`` in ``remote``, every commit reachable along any parent (newest first, with
    its parents), and the URL it was fetched from.

    The ref is fetched into a throwaway bare repository in a temporary folder, with no system,
    global or inherited git configuration, never into (or with the configuration of) the audited
    repository: its ``url.*.insteadOf`` cannot redirect the anchor, and no ref is written there."""
    import tempfile

    env = _isolated_env()

    def git_in(where: str, *args: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "--no-replace-objects", *args], cwd=where, capture_output=True, check=False, env=env
            )
        except OSError:
            return None
        return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None

    with tempfile.TemporaryDirectory(prefix="audit-anchor-") as tmp:
        bare = os.path.join(tmp, "anchor.git")
        if git_in(tmp, "init", "--quiet", "--bare", bare) is None:
            return None, remote
        url = (git_in(bare, "ls-remote", "--get-url", remote) or remote).strip() or remote
        if (
            remote.startswith("-")
            or git_in(
                bare,
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-write-fetch-head",
                remote,
                f"+{ref}:refs/audit/{ref[5:]}",
            )
            is None
        ):
            return None, url
        return git_in(
            bare, "log", "--topo-order", "--format=%H%x00%P%x00%cI%x00%B%x01", f"refs/audit/{ref[5:]}"
        ) or "", url
