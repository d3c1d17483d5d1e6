"""The view-lifetime scenario under valgrind memcheck: no invalid read or
write (or any other memcheck error) from the project's code.

CPython and the dynamic loader produce known noise under memcheck; we count
only errors whose stack passes through the native module."""

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import offgraph_kv

HERE = Path(__file__).resolve().parent
SCENARIO = HERE.parent / "valgrind" / "views_scenario.py"
SUPPRESSIONS = HERE.parent / "valgrind" / "python.supp"
NATIVE = Path(offgraph_kv._native.__file__).name


MEMORY_KINDS = ("InvalidRead", "InvalidWrite", "InvalidFree", "MismatchedFree", "Overlap")


def project_errors(xml_text: str, native: str = NATIVE) -> list[str]:
    """memcheck errors (kind and top frame) that the project can cause: any
    error whose stack has a frame in `native`, and any invalid access or free
    anywhere (a dangling view is read by numpy's code, not ours) except in the
    dynamic loader, whose strncmp over-reads are known memcheck noise.

    Every kind counts (invalid reads and writes, uninitialised values, bad
    frees) except leak reports: the run uses --leak-check=no, since a loaded
    extension's process-lifetime statics (rust-numpy's borrow-tracking capsule,
    PyO3's type objects) are never freed by design."""
    root = ET.fromstring(xml_text)
    found = []
    for err in root.iter("error"):
        if (err.findtext("kind") or "").startswith("Leak_"):
            continue
        frames = err.findall("./stack/frame")
        objs = [f.findtext("obj") or "" for f in frames]
        ours = any(native in o for o in objs)
        loader = any("ld-linux" in o for o in objs)
        if ours or (err.findtext("kind") in MEMORY_KINDS and not loader):
            top = frames[0].findtext("fn") if frames else "?"
            found.append(f"{err.findtext('kind')} at {top}")
    return found


def test_project_error_filter_sees_native_frames():
    xml = f"""<valgrindoutput>
      <error><kind>InvalidRead</kind><stack>
        <frame><fn>memcpy</fn><obj>/lib/libc.so.6</obj></frame>
        <frame><fn>write_rows</fn><obj>/x/offgraph_kv/{NATIVE}</obj></frame>
      </stack></error>
      <error><kind>Leak_DefinitelyLost</kind><stack>
        <frame><fn>malloc</fn><obj>/lib/vgpreload.so</obj></frame>
        <frame><fn>init</fn><obj>/x/offgraph_kv/{NATIVE}</obj></frame>
      </stack></error>
      <error><kind>UninitCondition</kind><stack>
        <frame><fn>maybe_small_long</fn><obj>/usr/bin/python3</obj></frame>
      </stack></error>
    </valgrindoutput>"""
    assert project_errors(xml) == ["InvalidRead at memcpy"]
    numpy_read = """<valgrindoutput><error><kind>InvalidRead</kind><stack>
        <frame><fn>pairwise_sum</fn><obj>/site-packages/numpy/_multiarray_umath.so</obj></frame>
      </stack></error><error><kind>InvalidRead</kind><stack>
        <frame><fn>strncmp</fn><obj>/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2</obj></frame>
      </stack></error></valgrindoutput>"""
    assert project_errors(numpy_read) == ["InvalidRead at pairwise_sum"]


def test_views_scenario_is_clean_under_memcheck(tmp_path):
    valgrind = shutil.which("valgrind")
    assert valgrind, "valgrind is installed by the test command"
    xml_file = tmp_path / "memcheck.xml"
    env = dict(os.environ, PYTHONMALLOC="malloc")
    proc = subprocess.run(
        [
            valgrind,
            "--tool=memcheck",
            "--xml=yes",
            f"--xml-file={xml_file}",
            "--num-callers=40",
            f"--suppressions={SUPPRESSIONS}",
            sys.executable,
            str(SCENARIO),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "views ok" in proc.stdout
    xml = xml_file.read_text()
    assert "<error>" in xml or "</valgrindoutput>" in xml
    errors = project_errors(xml)
    assert errors == [], errors


def test_byte_layer_and_view_tests_are_clean_under_memcheck(tmp_path):
    """The byte-layer and cell Python tests, run whole under memcheck."""
    valgrind = shutil.which("valgrind")
    assert valgrind, "valgrind is installed by the test command"
    xml_file = tmp_path / "memcheck.xml"
    env = dict(os.environ, PYTHONMALLOC="malloc")
    tests = [str(HERE / "test_kv_sequence.py"), str(HERE / "test_cell.py")]
    proc = subprocess.run(
        [
            valgrind,
            "--tool=memcheck",
            "--leak-check=no",
            "--xml=yes",
            f"--xml-file={xml_file}",
            "--num-callers=40",
            f"--suppressions={SUPPRESSIONS}",
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *tests,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
    errors = project_errors(xml_file.read_text())
    assert errors == [], errors
