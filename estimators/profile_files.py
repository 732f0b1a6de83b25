"""Finding and reading profile YAML files, with errors that name the file and the key (torch-free)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

CONFIGS_ENV = "TENSOROPT_CONFIGS"
"""Environment variable naming a configs directory (with devices/ and clusters/) to search first."""


class ProfileError(ValueError):
    """A profile could not be found or a field is missing or invalid (names the file and key)."""


def configs_dirs() -> list[Path]:
    """Directories searched for ``devices/`` and ``clusters/`` profiles, in order.

    ``$TENSOROPT_CONFIGS`` if set, then the repository's ``configs/`` (found relative to this
    package, which works for the editable install and the tests), then ``./configs``.

    Example:
        >>> any((d / "clusters").is_dir() for d in configs_dirs())
        True
    """
    dirs = []
    if os.environ.get(CONFIGS_ENV):
        dirs.append(Path(os.environ[CONFIGS_ENV]))
    dirs.append(Path(__file__).resolve().parent.parent / "configs")
    dirs.append(Path.cwd() / "configs")
    return dirs


def _find(kind: str, name: str) -> Path:
    """Resolve a profile name or path of ``kind`` ("devices" or "clusters") to a file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or os.sep in name:
        if p.is_file():
            return p
        raise ProfileError(f"{kind[:-1]} profile file not found: {name}")
    for d in configs_dirs():
        f = d / kind / f"{name}.yaml"
        if f.is_file():
            return f
    known = sorted({f.stem for d in configs_dirs() if (d / kind).is_dir() for f in (d / kind).glob("*.yaml")})
    raise ProfileError(
        f"unknown {kind[:-1]} profile {name!r}; known: {', '.join(known) or 'none'} "
        f"(or pass a path to a YAML file)"
    )


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    return data


class _Reader:
    """Typed access to a profile mapping that names file and key in every error."""

    def __init__(self, data: dict, where: str, prefix: str = "", sources: dict | None = None):
        self.data, self.where, self.prefix = data, where, prefix
        self.sources = sources if sources is not None else data.get("sources", {}) or {}
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.prefix}{k}"

    def number(
        self, k: str, *, positive: bool = True, default: float | None = None, cited: bool = True
    ) -> float:
        self.used.add(k)
        if k not in self.data:
            if default is not None:
                return default
            raise ProfileError(f"{self.where}: missing key {self.key(k)!r}")
        v = self.data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProfileError(f"{self.where}: key {self.key(k)!r} must be a number, got {v!r}")
        if (positive and v <= 0) or v < 0:
            raise ProfileError(
                f"{self.where}: key {self.key(k)!r} must be {'> 0' if positive else '>= 0'}, got {v}"
            )
        if cited and self.key(k) not in self.sources:
            raise ProfileError(f"{self.where}: key {self.key(k)!r} has no citation; add it under 'sources:'")
        return float(v)

    def text(self, k: str, default: str | None = None) -> str:
        self.used.add(k)
        v = self.data.get(k, default)
        if not isinstance(v, str):
            raise ProfileError(f"{self.where}: key {self.key(k)!r} must be a string, got {v!r}")
        return v

    def sub(self, k: str) -> _Reader:
        self.used.add(k)
        v = self.data.get(k)
        if not isinstance(v, dict):
            raise ProfileError(f"{self.where}: key {self.key(k)!r} must be a mapping, got {v!r}")
        return _Reader(v, self.where, f"{self.key(k)}.", self.sources)

    def check_unknown(self, allowed: set[str]) -> None:
        extra = set(self.data) - allowed - {"sources"}
        if extra:
            raise ProfileError(
                f"{self.where}: unknown key(s) {sorted(self.key(e) for e in extra)}; "
                f"expected some of {sorted(allowed)}"
            )
