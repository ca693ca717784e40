"""Which flags a release of an engine takes: `RuleSet` (a release era's name, releases, flag renames and
removed/deprecated flags, which each engine extends with its own switches), the rule set picked for a version
(ordered by `packaging` as PEP 440 orders them, the nearest with a warning), and `engine.args` translated to
that era's flag names. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from fleetgen.config import ArgValue


@dataclass(frozen=True)
class FlagRename:
    """A flag renamed between releases. `new` lists the replacement(s); the first is the translation."""

    old: str
    new: tuple[str, ...]
    note: str = ""
    still_accepted: bool = False  # a deprecated alias this release still parses (translated anyway)


@dataclass(frozen=True)
class RuleSet:
    """How one release era of an engine names its flags: what every engine's rules have. An engine subclasses
    it with the switches its own plan and log watcher read (`SGLangRules`, `VLLMRules`), in its own module.

    Names are flag names without dashes. `renames` map names of OTHER releases to this release's names.
    `min_version`/`max_version` are releases (`release`), both included.
    """

    name: str
    min_version: Version
    max_version: Version
    renames: tuple[FlagRename, ...] = ()
    removed_flags: Mapping[str, str] = field(default_factory=dict)
    deprecated_flags: Mapping[str, str] = field(default_factory=dict)  # parsed, with a warning


def release(text: str) -> Version:
    """A version string as the release it names, ordered as PEP 440 orders them (`packaging`):
    `0.5.23rc0` < `0.5.23` < `0.5.23.post1` < `0.5.24`; a local build (`0.5.15+cu128`) is its release.
    Raises `packaging.version.InvalidVersion` for a string that is no version."""
    return Version(Version(text).public)


def release_order(text: str) -> tuple[int, Version | str]:
    """A sort key for what hosts report as their engine version: versions as PEP 440 orders them (a local
    build after its release), after anything that is no version (in text order)."""
    try:
        return 1, Version(text)
    except InvalidVersion:
        return 0, text


def reported_releases(found: Iterable[str | None]) -> list[str]:
    """The engine versions hosts or nodes report (None or "": none read), each once, oldest first as
    `release_order` orders them (0.5.10 after 0.5.9)."""
    return sorted({v for v in found if v}, key=release_order)


def select_rule_set(rule_sets: Sequence[RuleSet], version: str | None) -> tuple[RuleSet, str | None]:
    """The rule set read from `version`'s release, or the nearest one with a warning saying so.

    In range → no warning. A pre-release (`0.5.23rc0`) of a release read → that release's rules, warned.
    Otherwise the newest rule set older than `version` (newer than all → the newest; older than all →
    the oldest), warned.
    """
    latest = max(rule_sets, key=lambda r: r.min_version)
    if not version:
        return (
            latest,
            f"engine version unknown: planning with the {latest.name} rules (the newest known); "
            "set engine.version or run without --offline so it is detected",
        )
    try:
        wanted = release(version)
    except InvalidVersion:
        return latest, (
            f"engine version {version!r} is not a version (PEP 440): planning with the {latest.name} rules "
            "(the newest known); set engine.version to the release the hosts run (e.g. 0.5.23)"
        )
    exact = _covering(rule_sets, wanted)
    if exact is not None:
        return exact, None
    if wanted.is_prerelease:  # a pre-release is cut from the branch that becomes the release
        final = _covering(rule_sets, Version(wanted.base_version))
        if final is not None:
            return final, (
                f"{version} is a pre-release: planning with the nearest, {final.name} (read from the "
                "final release); its sizing may differ"
            )
    older = [r for r in rule_sets if r.min_version <= wanted]
    oldest = min(rule_sets, key=lambda r: r.min_version)
    nearest = max(older, key=lambda r: r.min_version) if older else oldest
    where = "older than the oldest release read" if not older else "not a release read"
    if nearest is latest and older:
        where = "newer than the newest release read"
    return (
        nearest,
        f"no rule set for {version} ({where}): using the nearest, {nearest.name}; its sizing may differ",
    )


def _covering(rule_sets: Sequence[RuleSet], wanted: Version) -> RuleSet | None:
    return next((r for r in rule_sets if r.min_version <= wanted <= r.max_version), None)


@dataclass(frozen=True)
class Translation:
    """`engine.args` after renames for one rule set, and what was changed (for the plan's warnings)."""

    args: dict[str, ArgValue | list[ArgValue]]
    renamed: tuple[tuple[str, str], ...] = ()


def translate_args(args: Mapping[str, ArgValue | list[ArgValue]], rules: RuleSet) -> Translation:
    """Rewrite flags renamed in `rules`' era to the names that era accepts (first replacement)."""
    table = {r.old: r.new[0] for r in rules.renames}
    renamed = tuple((key, table[key]) for key in args if key in table)
    return Translation({table.get(key, key): value for key, value in args.items()}, renamed)
