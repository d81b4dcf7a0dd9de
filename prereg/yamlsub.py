"""The protocol's YAML, read with the standard library alone: the block reader and ``yaml_subset``."""

from __future__ import annotations

from prereg.bounded import MAX_DEPTH, MAX_YAML_CHARS
from prereg.yamlflow import (
    WS,
    KeyPath,
    YamlError,
    block_text,
    flow_value,
    fold_lines,
    join_quoted,
    plain_scalar,
    quote_end,
    unescape,
)

#: what PyYAML also takes for a line break, beside ``\n`` and ``\r\n`` (its scanner folds them
#: into the text in ways this reader does not follow; the harness refuses a protocol holding one)
ODD_BREAKS = "\r\x85\u2028\u2029"


def _marker(line: str) -> bool:
    """Whether ``line`` is a document marker: ``---`` or ``...`` at column 0, alone or before a space."""
    return line.startswith(("---", "...")) and line[3:4] in ("", " ", "\t")


class _FlowState:
    """Where a flow collection's scan stands between its lines (:meth:`_Reader.flow_collection`)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote: str | None = None
        self.opens = True  # whether a quote here would begin a scalar (a quote inside a plain one is text)
        self.closed = False  # whether the last character outside quotes (spaces aside) closed a quoted scalar


class _Reader:
    def __init__(self, text: str) -> None:
        if text.startswith("\ufeff"):
            raise YamlError(
                1, "the file starts with a byte order mark (U+FEFF): save it as UTF-8 without one"
            )
        if len(text) > MAX_YAML_CHARS:
            raise YamlError(1, f"{len(text)} characters: a protocol is read up to {MAX_YAML_CHARS}")
        self.raw = text.split("\n")
        if self.raw and self.raw[-1] == "":
            self.raw.pop()
        self.raw = [x[:-1] if x.endswith("\r") else x for x in self.raw]
        for n, x in enumerate(self.raw):
            odd = next((c for c in x if c in ODD_BREAKS), None)
            if odd is not None:
                raise YamlError(
                    n + 1,
                    f"the character {odd!r} is a line break to YAML: only \\n and \\r\\n are read; "
                    "write it escaped in a double-quoted string",
                )
        self.n = 0  # the current raw line
        self.started = False
        self.depth = 0  # the block collections the current node lies in
        self.lines: dict[KeyPath, int] = {}  # each key path's line (1-based)
        self.path: list[object] = []  # the key path of the node being read

    # -- lines -------------------------------------------------------------------------------
    def significant(self) -> int | None:
        """Skip blank and comment lines (and one leading ``---``); the next line's indent, or None."""
        while self.n < len(self.raw):
            line = self.raw[self.n]
            body = line.lstrip(" ")
            if not self._blank_or_comment(body):
                if body.startswith("\t"):
                    raise YamlError(self.n + 1, "a tab in indentation")
                if line.rstrip(WS) == "---" and not self.started:
                    self.started = True
                    self.n += 1
                    continue
                if line.startswith("...") and _marker(line) and self._only_comments_after(self.n + 1):
                    self.n = len(self.raw)  # the document's end marker, with nothing but comments after it
                    return None
                if _marker(line):
                    raise YamlError(self.n + 1, "a document marker (several YAML documents) is not read")
                self.started = True
                return len(line) - len(body)
            self.n += 1
        return None

    def _only_comments_after(self, n: int) -> bool:
        """Whether every raw line from ``n`` on is blank or a comment."""
        return all(self._blank_or_comment(x) for x in self.raw[n:])

    @staticmethod
    def _blank_or_comment(line: str) -> bool:
        return not line.strip(WS) or line.lstrip(WS).startswith("#")

    @staticmethod
    def _comment_at(s: str, i: int) -> bool:
        return s[i] == "#" and (i == 0 or s[i - 1] in " \t")

    def _key_split(self, s: str) -> tuple[str, str] | None:
        """``key: rest`` outside quotes and flows, or None when ``s`` is not a mapping entry."""
        if s[:1] in "[{" or s.startswith(("- ", "? ")) or s == "-":
            return None
        if s[:1] in "\"'":
            i = quote_end(s, 0)
            rest = s[i + 1 :]
            stripped = rest.lstrip(" ")
            if stripped.startswith(":") and (stripped[1:2] in ("", " ")):
                return s[: i + 1], stripped[1:]
            return None
        for i, ch in enumerate(s):
            if self._comment_at(s, i):
                return None
            if ch == ":" and (i + 1 == len(s) or s[i + 1] in " \t"):
                return s[:i], s[i + 1 :]
        return None

    # -- nodes -------------------------------------------------------------------------------
    def node(self, parent: int) -> object:
        """The node whose lines are indented more than ``parent`` (None when there is none)."""
        ind = self.significant()
        if ind is None or ind <= parent:
            return None
        return self.block(ind)

    def block(self, ind: int) -> object:
        """The node at column ``ind`` of the current line, one level deeper (refused past
        :data:`MAX_DEPTH`, before the reader's recursion could reach Python's limit)."""
        if self.depth >= MAX_DEPTH:
            raise YamlError(
                self.n + 1,
                f"nested deeper than {MAX_DEPTH} levels: a protocol is read at most {MAX_DEPTH} deep",
            )
        self.depth += 1
        try:
            return self._block(ind)
        finally:
            self.depth -= 1

    def _block(self, ind: int) -> object:
        s = self.raw[self.n][ind:]
        if s.startswith("- ") or s.rstrip(WS) == "-":
            return self.sequence(ind)
        if self._key_split(s) is not None:
            return self.mapping(ind)
        return self.inline(s, ind - 1, ind)

    def _entry(self, ind: int) -> str | None:
        """The next significant line from column ``ind`` when it is indented exactly ``ind`` (else
        ``None``: the block ended); a deeper line there is an error."""
        at = self.significant()
        if at is None or at != ind:
            if at is not None and at > ind:
                raise YamlError(self.n + 1, "unexpected indentation")
            return None
        return self.raw[self.n][ind:]

    def sequence(self, ind: int) -> list[object]:
        out: list[object] = []
        while True:
            s = self._entry(ind)
            if s is None:
                return out
            if not (s.startswith("- ") or s.rstrip(WS) == "-"):
                return out
            self.lines[tuple(self.path) + (len(out),)] = self.n + 1
            self.path.append(len(out))
            try:
                out.append(self._item(s, ind))
            finally:
                self.path.pop()

    def _item(self, s: str, ind: int) -> object:
        """One item of a block sequence at column ``ind`` (``s``: its line from the dash)."""
        item = s[1:]
        inner = len(item) - len(item.lstrip(" "))
        item = item.lstrip(" ")
        if not item or item.startswith("#"):
            self.n += 1
            return self.node(ind)
        if item.startswith("- ") or item.rstrip(WS) == "-" or self._key_split(item) is not None:
            # a compact nested node: re-read this line as if it started at the item's column
            self.raw[self.n] = " " * (ind + 1 + inner) + item
            return self.block(ind + 1 + inner)
        return self.inline(item, ind, ind + 1 + inner)

    def mapping(self, ind: int) -> dict[object, object]:
        out: dict[object, object] = {}
        while True:
            s = self._entry(ind)
            if s is None:
                return out
            kv = self._key_split(s)
            if kv is None:
                if s.startswith("- "):
                    return out
                raise YamlError(self.n + 1, f"not a mapping entry: {s.strip(WS)!r}")
            key_text, rest = kv
            line = self.n + 1
            key = self.inline_one(key_text, line)
            if isinstance(key, (list, dict)):
                raise YamlError(line, "a collection as a key is not read")
            if key in out:
                raise YamlError(line, f"duplicate key {key!r}")
            self.lines[tuple(self.path) + (key,)] = line
            self.path.append(key)
            try:
                out[key] = self._value(rest, ind)
            finally:
                self.path.pop()

    def _value(self, rest: str, ind: int) -> object:
        """A block mapping's value after its key's colon (``rest``), its key at column ``ind``."""
        body = rest.strip(WS)
        if not body or body.startswith("#"):
            self.n += 1
            nxt = self.significant()
            if nxt == ind and self._dash(self.raw[self.n][ind:]):
                return self.sequence(ind)
            return self.node(ind)
        col = len(self.raw[self.n]) - len(rest.lstrip(" "))
        return self.inline(rest.lstrip(" "), ind, col)

    def inline_one(self, text: str, line: int) -> object:
        t = text.strip(WS)
        if t[:1] == '"':
            return unescape(t[1:-1], line) if len(t) >= 2 and t.endswith('"') else self._bad(line, t)
        if t[:1] == "'":
            return t[1:-1].replace("''", "'") if len(t) >= 2 and t.endswith("'") else self._bad(line, t)
        return plain_scalar(t, line)

    @staticmethod
    def _bad(line: int, t: str) -> object:
        raise YamlError(line, f"unterminated quoted scalar {t!r}")

    def inline(self, text: str, parent: int, col: int) -> object:
        """A value that starts on the current line at column ``col``: quoted, flow, block scalar or
        plain, continued on the lines indented more than ``parent``."""
        line = self.n + 1
        if text[:1] in "&*!%@`" or text.startswith(("? ", "?\t")) or text.rstrip(WS) == "?":
            raise YamlError(
                line,
                f"{text.strip(WS)[:40]!r}: anchors, aliases, tags and complex keys are not "
                "read by the audit; write the value out",
            )
        if text[:1] in "|>":
            return self.block_scalar(text, parent)
        if text[:1] in "\"'":
            return self.quoted(text, col)
        if text[:1] in "[{":
            return self.flow_collection(col)
        # plain, possibly over several lines
        first = self._strip_plain(text)
        parts = [first]
        self.n += 1
        if "#" in text and first != text.rstrip(WS):
            return self._plain_checked(parts, line)
        while self.n < len(self.raw):
            raw = self.raw[self.n]
            body = raw.strip(WS)
            if not body:
                parts.append("")
                self.n += 1
                continue
            ind = len(raw) - len(raw.lstrip(" "))
            if ind <= parent or body.startswith("#") or _marker(raw):
                break
            if self._key_split(body) is not None:
                raise YamlError(
                    self.n + 1, "a mapping entry inside a plain scalar (mapping values are not allowed here)"
                )
            stripped = self._strip_plain(body)
            parts.append(stripped)
            self.n += 1
            if stripped != body:
                break
        while parts and parts[-1] == "":
            parts.pop()
        return self._plain_checked(parts, line)

    @staticmethod
    def _plain_checked(parts: list[str], line: int) -> object:
        return plain_scalar(parts[0], line) if len(parts) == 1 else fold_lines(parts)

    @staticmethod
    def _dash(s: str) -> bool:
        return s.startswith("- ") or s.rstrip(WS) == "-"

    def _strip_plain(self, s: str) -> str:
        for i in range(len(s)):
            if self._comment_at(s, i):
                return s[:i].rstrip(WS)
        return s.rstrip(WS)

    def quoted(self, text: str, col: int) -> str:
        line = self.n + 1
        q = text[0]
        buf = text[1:]
        parts: list[str] = []
        while True:
            i, end = 0, None
            while i < len(buf):
                if q == "'" and buf[i] == "'":
                    if buf[i + 1 : i + 2] == "'":
                        i += 2
                        continue
                    end = i
                    break
                if q == '"' and buf[i] == "\\":
                    i += 2
                    continue
                if q == '"' and buf[i] == '"':
                    end = i
                    break
                i += 1
            if end is not None:
                parts.append(buf[:end])
                after = buf[end + 1 :].strip(WS)
                if after and not after.startswith("#"):
                    raise YamlError(self.n + 1, f"text after a quoted scalar: {after!r}")
                self.n += 1
                break
            parts.append(buf)
            self.n += 1
            if self.n >= len(self.raw):
                raise YamlError(line, "unterminated quoted scalar")
            buf = self.raw[self.n]
            if _marker(buf):
                raise YamlError(self.n + 1, "a document marker inside a quoted scalar")
        return join_quoted(parts, q, line)

    def flow_collection(self, col: int) -> object:
        line = self.n + 1
        chunks: list[str] = []
        st = _FlowState()
        first = True
        while True:
            if self.n >= len(self.raw):
                raise YamlError(line, "unterminated flow collection")
            s = self.raw[self.n][col:] if first else self.raw[self.n]
            if not first and _marker(s):
                raise YamlError(self.n + 1, "a document marker inside a flow collection")
            first = False
            kept: list[str] = []
            done = self._flow_line(s, st, kept)
            chunks.append("".join(kept) if st.quote else "".join(kept).rstrip(WS))
            self.n += 1
            if done:
                break
        value, end = flow_value("\n".join(chunks), 0, line, self.depth + 1, (self.lines, tuple(self.path)))
        return value

    def _flow_line(self, s: str, st: _FlowState, kept: list[str]) -> bool:
        """Scan one line of a flow collection into ``kept`` (quotes, brackets and comments
        followed across lines in ``st``); whether the collection closed on it."""
        i = 0
        while i < len(s):
            ch = s[i]
            if st.quote:
                kept.append(ch)
                if st.quote == "'" and ch == "'" and s[i + 1 : i + 2] == "'":
                    kept.append("'")
                    i += 2
                    continue
                if st.quote == '"' and ch == "\\":
                    kept.append(s[i + 1 : i + 2])
                    i += 2
                    continue
                if ch == st.quote:
                    st.quote, st.opens, st.closed = None, False, True
            elif ch in "\"'" and st.opens:
                st.quote = ch
                kept.append(ch)
            elif self._comment_at(s, i):
                break
            else:
                if ch not in WS:
                    # after [ { , a scalar begins; after ":" too when a space follows it or a
                    # quoted key precedes it (``{"a":"b"}``)
                    st.opens = ch in "[{," or (
                        ch == ":" and (s[i + 1 : i + 2] in ("", " ", "\t") or st.closed)
                    )
                    st.closed = False
                if ch in "[{":
                    st.depth += 1
                elif ch in "]}":
                    st.depth -= 1
                kept.append(ch)
                if st.depth == 0:
                    rest = s[i + 1 :].strip(WS)
                    if rest and not rest.startswith("#"):
                        raise YamlError(self.n + 1, f"text after a flow collection: {rest!r}")
                    return True
            i += 1
        return False

    def block_scalar(self, header: str, parent: int) -> str:
        line = self.n + 1
        h = self._strip_plain(header)
        style, rest = h[0], h[1:]
        chomp, explicit = "clip", None
        for ch in rest:
            if ch in "+-":
                chomp = "keep" if ch == "+" else "strip"
            elif ch.isdigit() and ch != "0":
                explicit = int(ch)
            else:
                raise YamlError(line, f"bad block scalar header {h!r}")
        self.n += 1
        body: list[str] = []
        ind = parent + explicit if explicit is not None and parent >= 0 else (explicit if explicit else None)
        while self.n < len(self.raw):
            raw = self.raw[self.n]
            if _marker(raw):
                break
            if raw.strip(WS) == "":
                body.append(raw)
                self.n += 1
                continue
            cur = len(raw) - len(raw.lstrip(" "))
            if ind is None:
                if cur <= parent:
                    break
                ind = cur
            if cur < ind:
                break
            body.append(raw)
            self.n += 1
        lines = [b[ind:] if ind is not None and len(b) >= ind else "" for b in body]
        return block_text(lines, style, chomp)


def yaml_subset(text: str) -> object:
    """The YAML of a protocol, read with the standard library alone, giving what ``yaml.safe_load``
    gives: block mappings and sequences (compact ``- key: v`` items too), flow lists and mappings
    (over several lines too), plain scalars (multi-line folded too) resolved as PyYAML's YAML 1.1
    resolver does, single- and double-quoted scalars (escapes and line folding), literal and folded
    block scalars with chomping and indentation indicators, comments. Anchors, aliases, tags,
    dates, sexagesimal numbers and several documents raise :class:`YamlError` naming the line
    (``harness plan`` and ``harness tag`` refuse such a protocol, so the audit reads every one
    they accept)."""
    return yaml_lines(text)[0]


def yaml_lines(text: str) -> tuple[object, dict[KeyPath, int]]:
    """:func:`yaml_subset`'s value and the line (1-based) of every key path in it: a mapping's key
    path ends with the key (its line is the key's), a sequence item's with its index; ``()`` is the
    document's first line. Errors as :func:`yaml_subset`'s."""
    r = _Reader(text)
    ind = r.significant()
    if ind is None:
        return None, {}
    r.lines[()] = r.n + 1
    doc = r.block(ind)
    if r.significant() is not None:
        raise YamlError(r.n + 1, "unexpected indentation")
    return doc, r.lines
