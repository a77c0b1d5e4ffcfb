"""`mmtrt profile` end to end on the tiny bundle: the report folder, the JSON, compare mode, headless Chromium."""

import json
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from mmtrt.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tiny_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    image = tmp / "image.png"
    random_image(np.random.default_rng(), 80, 100).save(image)
    out = tmp / "report"
    argv = ["profile", str(tiny_bundle), str(tiny_bundle), "--image", str(image), "--prompt", "What is it?",
            "--batch", "1,2", "--context", "64,256,1000", "--rounds", "2", "--new-tokens", "4", "-o", str(out), "--json"]
    return out, argv


def test_json_carries_every_number_and_the_folder_holds_the_pictures(report, capsys):
    out, argv = report
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((out / "report.json").read_text())
    first = printed["bundles"][0]
    assert [row["batch"] for row in first["batches"]] == [1, 2]
    assert set(first["batches"][0]["stages"]) == {"tokenise", "preprocess", "vision_encoder", "projector",
                                                  "embed_merge", "prefill", "decode", "detokenise"}
    assert [c["context"] for c in first["context"]] == [64, 256, 1000] and first["context"][2]["decode_step_ms"] is None
    assert first["profiler_overhead"]["ratio"] > 0 and first["suggestions"]
    assert len(first["heads"]["llm"]) == 4 and first["heads"]["saliency"]["kept"]["0.25"]
    assert set(printed["stage_ratios"]) >= {"prefill", "decode", "request"}
    for k in range(2):
        trace = json.loads((out / f"trace_{k}.json").read_text())
        assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_every_picture_the_page_references_is_a_valid_png(report):
    out, _ = report
    html = (out / "index.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == 2 * 5 + 1
    for src in sources:
        data = (out / src).read_bytes()
        assert data.startswith(PNG)
        with Image.open(out / src) as img:
            img.verify()


def test_the_page_opens_in_headless_chromium(report):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (make test installs it with apt-get where it runs as root)")
    out, _ = report
    with tempfile.TemporaryDirectory() as profile:
        flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        page = (out / "index.html").resolve().as_uri()
        dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
        shot = out / "screenshot.png"
        subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,2000", page], capture_output=True,
                       timeout=120)
    assert "<h1>mmtrt profile</h1>" in dom and dom.count("<img") == 11 and "Side by side" in dom
    with Image.open(shot) as img:
        assert img.size == (1200, 2000) and len(np.unique(np.asarray(img.convert("L")))) > 10


def test_bad_lists_and_folders_are_one_line_errors(report, tiny_bundle, capsys, tmp_path):
    out, argv = report
    assert main([*argv[:7], "--batch", "1,x"]) == 2
    assert main([*argv[:7], "--batch", "99"]) == 2
    assert main(["profile", str(tmp_path), "--image", argv[4], "--prompt", "p"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mmtrt: error")]
    assert len(errors) == 3 and "1,x" in errors[0] and "envelope.batch" in errors[1] and "not a bundle" in errors[2]


def test_a_folder_of_the_user_s_files_is_refused_before_any_work(report, tmp_path, capsys):
    _, argv = report
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("my page")
    (mine / "report.json").write_text('{"mine": 1}')
    assert main([*argv[:-3], "-o", str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did not write (index.html, report.json)" in err, err
    assert (mine / "index.html").read_text() == "my page" and (mine / "report.json").read_text() == '{"mine": 1}'


def test_a_rerun_replaces_its_own_report_only(tmp_path):
    from mmtrt.errors import UserError
    from mmtrt.profile.output import check_output

    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"mmtrt_profile": ["index.html", "p.png", "report.json"]}))
    (out / "index.html").write_text("")
    (out / "p.png").write_bytes(PNG)
    check_output(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="notes.txt"):
        check_output(out)
