"""Renaming state-dict keys between our layout and another library's, both ways, from one table."""

from __future__ import annotations

import re


class KeyMap:
    """`mapping` pairs our key templates with theirs; `{i}` and `{j}` stand for indices. With a
    `suffix` pattern (e.g. r"weight|bias"), templates name modules and the suffix is carried over."""

    def __init__(self, mapping: dict[str, str], theirs: str, suffix: str | None = None):
        self.theirs, self.suffix = theirs, suffix
        self._to = self._compile(mapping)
        self._from = self._compile({v: k for k, v in mapping.items()})

    def _compile(self, mapping: dict[str, str]) -> list[tuple[re.Pattern, str]]:
        tail = rf"\.(?P<param>{self.suffix})" if self.suffix else ""
        rules = []
        for src, dst in mapping.items():
            pattern = re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
            rules.append((re.compile(f"^{pattern}{tail}$"), dst))
        return rules

    @staticmethod
    def _apply(key: str, rules, what: str) -> str:
        for pattern, template in rules:
            m = pattern.match(key)
            if m:
                groups = m.groupdict()
                out = template.replace("{i}", groups.get("i") or "").replace("{j}", groups.get("j") or "")
                return f"{out}.{groups['param']}" if groups.get("param") else out
        raise KeyError(f"no mapping for {what} key {key!r}")

    def our_key(self, key: str) -> str:
        return self._apply(key, self._from, self.theirs)

    def their_key(self, key: str) -> str:
        return self._apply(key, self._to, "lwm")

    def to_theirs(self, state_dict: dict) -> dict:
        return {self.their_key(k): v for k, v in state_dict.items()}

    def to_ours(self, state_dict: dict) -> dict:
        return {self.our_key(k): v for k, v in state_dict.items()}
