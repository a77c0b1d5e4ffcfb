"""What each suite is run with, from the recipe (`evaluate:`) or from `mmtrt eval`'s flags: the user's data files,
read and checked before any heavy work, the scorer and the source model."""

from __future__ import annotations

from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.eval import userdata
from mmtrt.eval.scorers import first_number
from mmtrt.recipe import AgreementSuite, Evaluation, QaSuite


def load_suite_data(config: Evaluation, suites: list[str], base: Path) -> dict[str, list[userdata.Sample]]:
    """Read and check the user's files for the qa and agreement suites (at plan time, before heavy work)."""
    data = {}
    if "qa" in suites:
        data["qa"] = userdata.jsonl(userdata.resolve(config.qa.data, base), answers=True, images="required")
        if config.qa.scorer == "numeric":
            for s in data["qa"]:
                if first_number(s.answer) is None:
                    raise UserError(f"{s.where}: answer {s.answer!r} is not a number, which the numeric scorer needs; "
                                    "give a number or choose scorer exact or contains")
    if "agreement" in suites:
        data["agreement"] = userdata.prompts(userdata.resolve(config.agreement.data, base))
    return data


def suite_options(config: Evaluation, data: dict[str, list[userdata.Sample]], source) -> dict[str, dict]:
    """Keyword arguments of every suite during compile: the user's data, the scorer, the source model."""
    return {
        "digits": {"limit": config.digits_limit},
        "perplexity": {"limit": config.perplexity_windows},
        "qa": {"limit": config.qa.limit, "data": data.get("qa"), "scorer": config.qa.scorer,
               "tolerance": config.qa.tolerance, "max_new_tokens": config.qa.max_new_tokens},
        "agreement": {"limit": config.agreement.limit, "data": data.get("agreement"), "source": source,
                      "max_new_tokens": config.agreement.max_new_tokens, "references": {}},
    }


def cli_options(suite: str, data: Path | None, scorer: str, tolerance: float, max_new_tokens: int, source) -> dict:
    """`mmtrt eval --suite qa|agreement --data FILE`: the suite's keyword arguments, limit aside."""
    if suite not in ("qa", "agreement"):
        return {"source": source} if suite == "parity" else {}
    if data is None:
        raise UserError(f"--suite {suite} needs --data FILE (qa: JSONL of image, prompt, answer; agreement: a prompts "
                        "file or JSONL)")
    if tolerance < 0 or max_new_tokens < 1:
        raise UserError(f"--tolerance must be 0 or more and --max-new-tokens at least 1, got {tolerance} and "
                        f"{max_new_tokens}")
    config = Evaluation(qa=QaSuite(data=str(data), scorer=scorer, tolerance=tolerance, max_new_tokens=max_new_tokens),
                        agreement=AgreementSuite(data=str(data), max_new_tokens=max_new_tokens))
    options = suite_options(config, load_suite_data(config, [suite], Path.cwd()), source)[suite]
    return {k: v for k, v in options.items() if k != "limit"}
