"""Every shell command in README.md and docs/ is run: here, by another test, or by CI; every relative link resolves.

A fenced ``bash`` block right after the line ``<!-- doc-test: run -->`` (an HTML comment: GitHub shows nothing)
holds cheap commands (``--help``): this test runs each one, and it must exit 0. Every other command of a fenced
``bash`` block must match an entry of COVERED, which names where it runs (a test, CI) or, for a benchmark no test
runs, the committed results it produced, or that it is not run here and the document says so; the entry's
file must exist and hold the quoted text. A command that matches no entry fails the test. The flags of our own
programs' commands are also checked against the programs themselves (``timelyllm-bench`` through its own
parser), so a renamed option fails here before a reader finds it. Fast: the ``--help`` runs take a few seconds.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
# the files whose relative links must resolve: the documents, the changelog and the history moved out of the README
LINKED = (*DOCS, "CHANGELOG.md", "bench/results/demo_cpu/README.md", "bench/results/plan_quality/README.md")
RUN_MARKER = "<!-- doc-test: run -->"
RUN_TIMEOUT_S = 30


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str  # one logical line: continuations joined, trailing comment cut, whitespace collapsed
    run: bool


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def _blocks(doc: str) -> list[tuple[int, str, bool, list[str]]]:
    """(line of the fence, info string, marked runnable, body lines) of every fenced block of a document."""
    lines = (ROOT / doc).read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(m.group(2)):
            j += 1
        assert j < len(lines), f"{doc}:{i + 1}: a fenced block that never closes"
        out.append((i + 1, m.group(3).strip(), i > 0 and lines[i - 1].strip() == RUN_MARKER, lines[i + 1:j]))
        i = j + 1
    return out


def _logical(body: list[str]) -> list[tuple[int, str]]:
    """(offset, command) per logical line: `\\` continuations joined, comments and blank lines dropped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for k, raw in enumerate(body):
        line = raw.rstrip()
        if not pending:
            start = k
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = re.sub(r"(^|\s+)#(\s.*)?$", "", pending + line).strip()
        pending = ""
        if text:
            out.append((start, " ".join(text.split())))
    assert not pending, f"a command ends with a line continuation: {pending!r}"
    return out


@cache
def commands() -> tuple[Command, ...]:
    found = []
    for doc in DOCS:
        for line, info, run, body in _blocks(doc):
            if info.split()[:1] == ["bash"]:
                found += [Command(doc, line + 1 + k, text, run) for k, text in _logical(body)]
    return tuple(found)


@dataclass(frozen=True)
class Cover:
    pattern: str  # a regex the whole command matches
    how: str  # "ci", "test", "results" (a benchmark no test runs: the committed results of its run) or "not run"
    evidence: tuple[tuple[str, str], ...]  # (file, text it holds)


# Where each command that this test does not run is run. Keep it honest: a command no test runs says so.
COVERED = (
    # -- the two commands
    Cover(r"make test", "ci",
          ((".ci/run", "make test PYTEST_ARGS="), ("Makefile", "python -m pytest -q $(PYTEST_ARGS)"))),
    Cover(r'make demo( DEMO_ARGS=".*")?', "test",  # the demo module the target runs, on the simulated engine
          (("Makefile", "python -m timelyllm_ros.demo $(DEMO_ARGS)"),
           ("test/test_demo.py", '"-m", "timelyllm_ros.demo"'), ("test/test_tello_demo.py", '"--compare", ""'))),
    Cover(r"\. env\.sh", "ci", ((".ci/run", ". ./env.sh"), ("Makefile", ". ./env.sh"))),
    # -- a colcon workspace (test/colcon_ws.py builds it as the README says; test_colcon_build.py uses it)
    Cover(r"scripts/setup\.sh && \. \.venv/bin/activate", "ci", ((".ci/run", "scripts/setup.sh"),)),
    Cover(r"mkdir -p ~/ws/src && git clone \. ~/ws/src/timelyllm_ros", "test",
          (("test/colcon_ws.py", "copy_repo(ws / \"src\" / PKG)"),)),
    Cover(r"export AMENT_PREFIX_PATH=\$VIRTUAL_ENV CMAKE_PREFIX_PATH=\$VIRTUAL_ENV", "test",
          (("test/colcon_ws.py", 'env["AMENT_PREFIX_PATH"] = str(VENV)'),
           ("test/colcon_ws.py", 'env["CMAKE_PREFIX_PATH"] = str(VENV)'))),
    Cover(r"cd ~/ws && colcon build --packages-select timelyllm_ros --cmake-args "
          r"-DPython3_EXECUTABLE=\$VIRTUAL_ENV/bin/python", "test",
          (("test/colcon_ws.py", '"build", "--packages-select", pkg, "--cmake-args", f"-DPython3_EXECUTABLE='),)),
    Cover(r"\. install/setup\.bash", "test", (("test/test_colcon_build.py", 'str(ws / "install" / "setup.bash")'),
                                             ("test/test_launch.py", '. "$1" && env -0'))),
    Cover(r"install/timelyllm_ros/lib/timelyllm_ros/plan_client --help", "test",
          (("test/test_colcon_build.py", '(libexec / "plan_client"), "--help")'),)),
    # -- the ros2 tools overlay (test_launch.py's ros2_setup fixture)
    Cover(r"cp -r \$TOOLS/src/composition_interfaces ~/ws/src/ && chmod -R u\+w ~/ws/src/composition_interfaces",
          "test", (("test/test_launch.py", 'shutil.copytree(ROS2_TOOLS / "src" / "composition_interfaces"'),)),
    Cover(r"cd ~/ws && colcon build --packages-select composition_interfaces --cmake-args "
          r"-DPython3_EXECUTABLE=\$VIRTUAL_ENV/bin/python -DBUILD_TESTING=OFF", "test",
          (("test/test_launch.py", 'colcon_build(ws, "composition_interfaces", "-DBUILD_TESTING=OFF")'),)),
    Cover(r"pip install --no-index --no-deps --find-links \$TOOLS/wheels --target ~/ros2-overlay .*", "test",
          (("test/test_launch.py", '"--no-deps", "--find-links", str(ROS2_TOOLS / "wheels"), "--target"'),)),
    Cover(r"export PYTHONPATH=~/ros2-overlay:\$PYTHONPATH PATH=~/ros2-overlay/bin:\$PATH "
          r"AMENT_PREFIX_PATH=~/ros2-overlay:\$AMENT_PREFIX_PATH", "test",
          (("test/test_launch.py", 'for var in ("PYTHONPATH", "AMENT_PREFIX_PATH"):'),
           ("test/test_launch.py", 'env["PATH"] = os.pathsep.join([str(overlay / "bin"), env["PATH"]])'))),
    # -- ros2: test_launch.py runs exactly these (test_ros2_commands_are_the_ones_test_launch_runs)
    Cover(r"ros2 .*", "test", (("test/test_launch.py", "def test_readme_ros2_workflow_under_the_real_launch_and_cli"),
                               ("test/test_launch.py", "def test_readme_lists_exactly_the_commands_the_tests_run"))),
    # -- an apt-installed ROS 2: not here (the README says so); package.xml is checked against the imports
    Cover(r"mkdir -p ~/ws/src && cd ~/ws/src && git clone <this repo> timelyllm_ros|"
          r"cd ~/ws && rosdep install --from-paths src --ignore-src -y|"
          r"colcon build --packages-select timelyllm_ros && \. install/setup\.bash|pip install vllm", "not run",
          (("README.md", "Not verified here: an apt-installed ROS 2 itself, rosdep's resolution"),
           ("test/test_package.py", "def test_package_xml_declares_what_the_package_imports"))),
    # -- without ros2 launch; a vLLM server
    Cover(r"timelyllm up --config \S+( \[.*\])*", "test",
          (("test/test_launch.py", '"-m", "timelyllm_ros.cli", "up", "--config"'),)),
    Cover(r"timelyllm plan .*", "test",  # the plan_client that test_launch.py runs through ros2 run
          (("timelyllm_ros/cli.py", 'client_main(["plan_client", *rest])'),
           ("test/test_launch.py", 'PLAN = f"ros2 run timelyllm_ros plan_client'))),
    Cover(r"vllm serve models/SmolLM2-135M-Instruct .*", "test",  # the same server, started as python -m vllm...
          (("devtools/vllm_server.py", '"--enforce-eager", "--enable-prefix-caching"'),
           ("devtools/vllm_server.py", '"--enable-prompt-tokens-details"'),
           ("test/test_engine_remote.py", "VllmServer("))),
    # -- benchmarks: a test runs the command or its code on small inputs; else the committed results of its run
    Cover(r"timelyllm-bench sim .*", "test", (("test/test_bench_cli.py", "cli.run_policy(wl, p, None, args)"),)),
    Cover(r"timelyllm-bench overhead", "test", (("test/test_bench_cli.py", "cli.measure_overhead(16"),)),
    Cover(r"timelyllm-bench fleet-load", "test", (("test/test_fleet_load.py", 'bench_main(["fleet-load"'),)),
    Cover(r"timelyllm-bench flood .*", "test", (("test/test_intake.py", '"-m", "bench.flood", "client"'),)),
    Cover(r"timelyllm-bench (load-sweep|shed-audit)( .*)?", "test",
          (("test/test_load_sweep.py", "cli.build_parser().parse_args(argv)"),
           ("test/test_load_sweep.py", '_run(["shed-audit"'))),
    Cover(r"timelyllm-bench pool", "test", (("test/test_pool_bench.py", "pool_bench.cmd_pool"),)),
    Cover(r"timelyllm-bench plan-quality .*", "test",
          (("test/test_bench_cli.py", 'cli.build_parser().parse_args(["plan-quality"'),)),
    Cover(r"python -m bench\.preempt_audit", "test", (("test/test_pud_shed.py", "from bench import preempt_audit"),)),
    Cover(r"timelyllm-bench figures", "results", (("bench/results/figures_last_run.txt", "timelyllm-bench figures"),)),
    Cover(r"timelyllm-bench fleet-key", "results", (("bench/results/README.md", "timelyllm-bench fleet-key"),)),
    Cover(r"timelyllm-bench real-policies( .*)?", "results",
          (("bench/results/README.md", "timelyllm-bench real-policies"), ("test/test_real_policies.py",
                                                                           "from bench.real_policies import"))),
    Cover(r"timelyllm-bench plan-lengths", "results",
          (("bench/results/plan_lengths/results.md", "timelyllm-bench plan-lengths"),
           ("test/test_plan_lengths.py", "from bench.plan_lengths import"))),
    Cover(r"python -m bench\.urgent_burst( .*)?", "results",
          (("bench/results/README.md", "python -m bench.urgent_burst"),)),
    Cover(r"python bench/first_segment\.py .*", "results",
          (("bench/results/plan_quality/first_segment.md", "first_segment"),
           ("bench/results/README.md", "bench/first_segment.py"))),
)

# Our programs: a documented command's --flags must be options the program itself prints with --help.
# (timelyllm-bench is checked through its own parser instead: test_bench_commands_parse.)
HELP_OF = {
    "timelyllm up": "timelyllm up --help",
    "timelyllm plan": "timelyllm plan --help",
    "python -m timelyllm_ros.demo": "python -m timelyllm_ros.demo --help",
    "python -m bench.urgent_burst": "python -m bench.urgent_burst --help",
    "python -m bench.preempt_audit": "python -m bench.preempt_audit --help",
    "python bench/first_segment.py": "python bench/first_segment.py --help",
}


def _id(c: Command) -> str:
    return f"{c.doc}:{c.line}"


def test_the_documents_have_commands_both_run_and_covered():
    cmds = commands()
    assert any(c.run for c in cmds) and any(not c.run for c in cmds), cmds
    assert any(c.doc == "README.md" and c.text == "make test" for c in cmds)  # the README's test command ...
    assert "\nmake test PYTEST_ARGS=" in (ROOT / ".ci/run").read_text()  # ... is the one CI runs


def test_every_fenced_block_names_its_language_and_shell_is_bash():
    """A shell block without ``bash`` would escape this test; a block with no language renders without colour."""
    bad = [f"{doc}:{line} ```{info}" for doc in DOCS for line, info, _, _ in _blocks(doc)
           if not info or info.split()[0] in ("sh", "shell", "console", "zsh", "shell-session")]
    assert not bad, f"name the block's language (shell commands: bash): {bad}"


def test_a_run_marker_stands_only_before_a_bash_block():
    for doc in DOCS:
        lines = (ROOT / doc).read_text().split("\n")
        for i, line in enumerate(lines):
            if line.strip() == RUN_MARKER:
                assert i + 1 < len(lines) and lines[i + 1].strip() == "```bash", f"{doc}:{i + 1}"


@pytest.mark.parametrize("cmd", [c for c in commands() if c.run], ids=_id)
def test_runnable_commands_exit_0(cmd):
    p = subprocess.run(["bash", "-c", cmd.text], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, f"{_id(cmd)}: `{cmd.text}` exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    assert p.stdout.strip(), f"{_id(cmd)}: `{cmd.text}` printed nothing"


def test_every_other_command_is_covered_by_a_test_ci_or_its_results():
    unmapped = [f"{_id(c)}: {c.text}" for c in commands()
                if not c.run and not any(re.fullmatch(cv.pattern, c.text) for cv in COVERED)]
    assert not unmapped, "commands neither run here nor in COVERED (name the test or CI step that runs each):\n" + \
        "\n".join(unmapped)


@pytest.mark.parametrize("cover", COVERED, ids=lambda cv: cv.pattern[:60])
def test_each_cover_names_what_exists_and_is_used(cover):
    assert cover.how in ("ci", "test", "results", "not run")
    for path, text in cover.evidence:
        f = ROOT / path
        assert f.is_file(), f"{path} does not exist (COVERED: {cover.pattern})"
        assert text in f.read_text(), f"{path} no longer holds {text!r} (COVERED: {cover.pattern})"
    assert any(re.fullmatch(cover.pattern, c.text) for c in commands() if not c.run), \
        f"no command of the documents matches {cover.pattern!r}: remove the entry"


def test_ros2_commands_are_the_ones_test_launch_runs():
    from test_launch import TWO_FLEETS, WORKFLOW

    ros2 = [c for c in commands() if c.text.startswith("ros2 ")]
    assert ros2 and all(c.doc == "README.md" for c in ros2), ros2
    assert [c.text for c in ros2] == [*WORKFLOW, *TWO_FLEETS]


def test_bench_commands_parse():
    """Every documented ``timelyllm-bench`` command line parses with the bench's own parser: the subcommand exists,
    and so does each option, with a value it takes."""
    from bench.cli import build_parser

    parser = build_parser()
    bench = [c for c in commands() if c.text.startswith("timelyllm-bench ") and "--help" not in c.text]
    assert len(bench) >= 10, bench
    for c in bench:
        try:
            parser.parse_args(shlex.split(c.text)[1:])
        except SystemExit as e:
            pytest.fail(f"{_id(c)}: `{c.text}` does not parse (exit {e.code})")


@cache
def _help(cmd: str) -> str:
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, f"`{cmd}` exited {p.returncode}: {p.stderr[-2000:]}"
    return p.stdout


def _program_and_args(text: str) -> tuple[str, list[str]] | None:
    words = shlex.split(text.replace("[", "").replace("]", ""))
    m = re.fullmatch(r'make demo DEMO_ARGS="(.*)"', text)
    if m:
        return "python -m timelyllm_ros.demo", shlex.split(m.group(1))
    for prog in HELP_OF:
        n = len(prog.split())
        if words[:n] == prog.split():
            return prog, words[n:]
    return None


def test_the_flags_of_our_commands_are_the_programs_own():
    checked = 0
    for c in commands():
        found = _program_and_args(c.text)
        if found is None or "--help" in found[1]:
            continue
        prog, args = found
        text = _help(HELP_OF[prog])
        for flag in (a.split("=", 1)[0] for a in args if a.startswith("--")):
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text, re.M), \
                f"{_id(c)}: `{prog} --help` has no {flag}"
        checked += 1
    assert checked >= 5


# -- links ----------------------------------------------------------------------------------------------------------
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces to -."""
    out = set()
    in_fence = False
    for line in doc.read_text().split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"#{1,6}\s+(.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_relative_links_resolve():
    bad = []
    for doc in LINKED:
        src = ROOT / doc
        text = re.sub(r"```.*?```", "", src.read_text(), flags=re.S)
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (src.parent / path).resolve() if path else src
            if not dest.exists():
                bad.append(f"{doc}: {target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{doc}: {target} (no heading #{anchor} in {path or doc})")
    assert not bad, "\n".join(bad)


# -- current figures ------------------------------------------------------------------------------------------------
def _section(doc: str, heading: str) -> str:
    text = (ROOT / doc).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_the_readmes_current_figures_are_those_of_docs_benchmarks():
    """The README's "Current figures" says nothing docs/benchmarks.md's does not: one place to update them from."""
    number = re.compile(r"[-+]?\d+(?:[.,]\d+)*")
    readme = set(number.findall(_section("README.md", "## Current figures")))
    bench = set(number.findall(_section("docs/benchmarks.md", "## Current figures")))
    assert readme, "README.md has no figures in its Current figures"
    assert not readme - bench, f"in README.md's Current figures but not in docs/benchmarks.md's: {readme - bench}"
