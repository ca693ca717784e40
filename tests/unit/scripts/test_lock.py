"""requirements.lock agrees with pyproject.toml (issue 30), offline: every requirement fleetgen states — its
dependencies, every extra (dev, ray), the build backend — is met by the one version the lock pins for it,
on every Python the project supports; every pin is exact and hashed (pip's --require-hashes installs it);
torch is never in it (the project venv has none). pyproject edited without `scripts/lock.sh` fails here,
naming the requirement and the command that fixes it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
LOCK = ROOT / "requirements.lock"
# requires-python = ">=3.11": the releases the lock must serve (each one's markers evaluated).
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
NEVER = {"torch"}


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]


def read_lock(text: str) -> list[Pin]:
    """The pins of a hashed requirements file: `name==version [; marker] \\ --hash=… …`, comments aside."""
    logical, pins = "", []
    for line in text.splitlines():
        line = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        logical += line.rstrip().removesuffix("\\")
        if line.rstrip().endswith("\\"):
            continue
        if logical.strip():
            spec, *hashes = logical.split(" --hash=")
            req = Requirement(spec.strip())
            [exact] = req.specifier  # one `==`: anything else is no lock
            assert exact.operator == "==", logical
            pins.append(Pin(canonicalize_name(req.name), exact.version, req.marker, tuple(hashes)))
        logical = ""
    return pins


def requirements(pyproject: dict[str, Any]) -> list[Requirement]:
    project = pyproject["project"]
    extras = project["optional-dependencies"].values()  # every extra is locked (scripts/lock.sh --extra …)
    stated = [*project["dependencies"], *(r for extra in extras for r in extra)]
    return [Requirement(r) for r in [*stated, *pyproject["build-system"]["requires"]]]


def environments() -> list[dict[str, str]]:
    """This platform's marker environment on each supported Python (the `dev` extra asked for)."""
    here = {key: str(value) for key, value in default_environment().items()}
    return [{**here, "python_version": v, "python_full_version": f"{v}.0", "extra": "dev"} for v in PYTHONS]


def disagreements(pyproject: dict[str, Any], pins: list[Pin]) -> list[str]:
    """Why the lock does not serve pyproject: a requirement unpinned, pinned twice, or pinned out of range."""
    found = []
    for req, env in ((r, e) for r in requirements(pyproject) for e in environments()):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name, python = canonicalize_name(req.name), env["python_version"]
        chosen = [p for p in pins if p.name == name and (p.marker is None or p.marker.evaluate(env))]
        if len(chosen) != 1:
            found.append(f"{req} on Python {python}: the lock pins {len(chosen)} versions of {name}")
        elif not req.specifier.contains(chosen[0].version, prereleases=True):
            found.append(f"{req} on Python {python}: the lock pins {name}=={chosen[0].version}")
    return sorted(set(found))


def read_pyproject(text: str | None = None) -> dict[str, Any]:
    return tomllib.loads(text if text is not None else (ROOT / "pyproject.toml").read_text())


def test_the_lock_serves_every_requirement_of_pyproject_on_every_supported_python() -> None:
    found = disagreements(read_pyproject(), read_lock(LOCK.read_text()))
    assert found == [], "requirements.lock is out of date; fix: run scripts/lock.sh\n" + "\n".join(found)


def test_every_pin_is_exact_and_hashed_and_torch_is_never_pulled_in() -> None:
    pins = read_lock(LOCK.read_text())
    assert len({p.name for p in pins}) > 30  # the file was read, not skipped
    assert all(p.hashes and all(h.startswith("sha256:") for h in p.hashes) for p in pins)
    assert NEVER.isdisjoint(p.name for p in pins)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("packaging>=23", "packaging>=999"), "packaging>=999 on Python 3.11: the lock pins packaging=="),
        (
            ("tokenizers>=0.15", 'tokenizers>=0.15", "left-pad>=1'),
            "left-pad>=1 on Python 3.11: the lock pins 0",
        ),
        (
            ('"pytest>=8"', '"Pytest_XDist>=99"'),
            "Pytest_XDist>=99 on Python 3.14: the lock pins pytest-xdist==",
        ),
        (('"setuptools>=68"', '"setuptools<60"'), "setuptools<60 on Python 3.12"),
        (("pyyaml>=6", "pyyaml>=6; python_version >= '3.13'\", \"numpy>=2.5"), "numpy>=2.5 on Python 3.11"),
    ],
)
def test_a_pyproject_the_lock_does_not_serve_is_named(edit: tuple[str, str], says: str) -> None:
    """The check can fail: each edit of the real pyproject is one the real lock does not serve — a range
    raised, a new dependency, a name spelled otherwise, the build backend, a dependency of one Python only."""
    text = (ROOT / "pyproject.toml").read_text()
    assert edit[0] in text
    found = disagreements(read_pyproject(text.replace(edit[0], edit[1], 1)), read_lock(LOCK.read_text()))
    assert any(says in f for f in found), found


def test_a_lock_pins_one_version_per_python_where_markers_split_it() -> None:
    """numpy is locked twice (its newest release wants Python 3.12): each Python sees exactly one pin."""
    pins = read_lock(
        "numpy==2.4.6 ; python_full_version < '3.12' \\\n    --hash=sha256:aa\n"
        "numpy==2.5.5 ; python_full_version >= '3.12' \\\n    --hash=sha256:bb\n"
    )
    pyproject = {
        "project": {"dependencies": ["numpy>=2.5"], "optional-dependencies": {"dev": []}},
        "build-system": {"requires": []},
    }
    assert disagreements(pyproject, pins) == ["numpy>=2.5 on Python 3.11: the lock pins numpy==2.4.6"]
