"""The one resolver a server opens every client image through: data: URIs, and regular files inside the
allow-list by their real path (relative names inside it), opened without blocking or following a link out; every
refusal names the request's own text only, and says nothing about what exists outside the allow-list."""

import base64
import io
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from mmtrt.errors import UserError
from mmtrt.runtime.image_source import ImageSource

MIB = 2**20


@pytest.fixture
def tree(tmp_path, rng):
    """allowed/ (an image, a folder, a FIFO, links in and out), and outside/ beside it (an image, a link)."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    random_image(rng, 24, 32).save(allowed / "sub" / "in.png")
    random_image(rng, 24, 32).save(outside / "secret.png")
    os.mkfifo(allowed / "pipe.png")
    (allowed / "link-in.png").symlink_to(allowed / "sub" / "in.png")
    (allowed / "link-out.png").symlink_to(outside / "secret.png")
    (allowed / "zero.png").symlink_to("/dev/zero")
    (outside / "link").symlink_to(allowed / "sub")
    return allowed, outside


def refusal(source, name) -> str:
    with pytest.raises(UserError) as err:
        source(name)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_files_inside_open_by_path_relative_path_or_file_url(tree, monkeypatch):
    allowed, _ = tree
    source = ImageSource(allowed, None, MIB)
    expected = np.asarray(Image.open(allowed / "sub" / "in.png"))
    monkeypatch.chdir(allowed.parent.parent)  # a relative name is the folder's, not the working directory's
    for name in (str(allowed / "sub" / "in.png"), "sub/in.png", "./sub/../sub/in.png", "link-in.png",
                 f"file://{allowed}/sub/in.png"):
        assert np.array_equal(np.asarray(source(name)), expected), name


def test_outside_is_one_answer_whatever_exists_there(tree):
    allowed, outside = tree
    source = ImageSource(allowed, None, MIB)
    names = [str(outside / "secret.png"), str(outside / "missing.png"), "../outside/secret.png", "link-out.png",
             "zero.png", f"{allowed}/../outside/link/../in.png", f"{allowed}/../outside/plain/../in.png",
             "/etc/passwd", "/nonexistent/x.png", f"file://{outside}/secret.png"]
    messages = {name: refusal(source, name) for name in names}
    for name, message in messages.items():
        assert str(allowed) not in message and str(outside) not in message.replace(repr(name[:60]), "")
        assert message.replace(repr(name[:60]), "NAME") == messages[names[0]].replace(repr(names[0][:60]), "NAME")


def test_what_is_not_a_regular_file_is_refused_at_once(tree):
    allowed, _ = tree
    source = ImageSource(allowed, None, MIB)
    answers = []
    reader = threading.Thread(target=lambda: answers.append(refusal(source, "pipe.png")), daemon=True)
    t0 = time.monotonic()
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the reader so the test ends
        with open(allowed / "pipe.png", "wb") as fifo:
            fifo.write(b"x")
    assert not reader.is_alive() and time.monotonic() - t0 < 5
    assert "not a regular file" in answers[0]
    for name in ("sub", "sub/", "."):
        assert "is a folder, not an image file" in refusal(source, name)
    assert "does not exist in this server's image folder" in refusal(source, "sub/missing.png")
    assert "NUL" in refusal(source, "sub/in.png\0.jpg")


def test_limits_and_sources(tree, rng):
    allowed, _ = tree
    random_image(rng, 200, 150).save(allowed / "big.png")
    assert "29999 this server decodes" in refusal(ImageSource(allowed, 29_999, MIB), "big.png")
    assert "the most this server reads" in refusal(ImageSource(allowed, None, 1000), "big.png")
    assert "without --allow-images" in refusal(ImageSource(None, None, MIB), "sub/in.png")
    assert "never fetches" in refusal(ImageSource(allowed, None, MIB), "http://example.com/a.png")
    assert "a string" in refusal(ImageSource(allowed, None, MIB), 7)
    buffer = io.BytesIO()
    random_image(rng, 200, 150).save(buffer, "PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    assert ImageSource(None, None, MIB)(uri).size == (150, 200)
    assert "29999 this server decodes" in refusal(ImageSource(None, 29_999, MIB), uri)
