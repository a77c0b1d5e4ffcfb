"""The C++ runtime refuses an any-resolution bundle at load, in one line that names the runtime that runs it."""

from builders import random_image
from cpp_harness import needs_build, run_cpp

pytestmark = needs_build


def test_an_any_resolution_bundle_is_refused_in_one_line_at_load(next_bundle, rng, tmp_path):
    image = tmp_path / "image.png"
    random_image(rng, 40, 90).save(image)
    proc = run_cpp(next_bundle, image, "hi")
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "llava_next model, which tiles each image at any resolution" in lines[0]
    assert "run this bundle with the Python runtime" in lines[0]
