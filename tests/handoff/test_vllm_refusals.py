"""`mmtrt serve --llm vllm` refuses what it cannot run in one line with exit code 2, before any server starts: no
vLLM environment, a python that is not there, a folder that is no Hugging Face export. Needs no vLLM."""

from __future__ import annotations

import pytest

from mmtrt.cli import main


def serve(bundle, *extra) -> list[str]:
    return ["serve", str(bundle), "--llm", "vllm", "--no-triton", "--port", "0", *extra]


@pytest.fixture
def export(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_no_vllm_environment_names_the_command_that_makes_it(tiny_bundle, export, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MMTRT_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("MMTRT_VLLM_ENV", str(tmp_path / "absent"))
    assert main(serve(tiny_bundle, "--llm-folder", str(export))) == 2
    line = one_line_error(capsys)
    assert "no vLLM environment" in line and "python -m mmtrt.handoff.vllm_env" in line


def test_a_vllm_python_that_is_not_there(tiny_bundle, export, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MMTRT_VLLM_PYTHON", str(tmp_path / "nopython"))
    assert main(serve(tiny_bundle, "--llm-folder", str(export))) == 2
    assert "MMTRT_VLLM_PYTHON" in one_line_error(capsys)


def test_a_folder_without_config_json(tiny_bundle, tmp_path, capsys):
    assert main(serve(tiny_bundle, "--llm-folder", str(tmp_path))) == 2
    line = one_line_error(capsys)
    assert "config.json" in line and "mmtrt export hf" in line
