"""Stage times add up to the request's wall time; memory, KV bytes and limits are what the bundle says."""

import json
import subprocess
import sys

import numpy as np
import pytest

from builders import random_image
from mmtrt.errors import UserError
from mmtrt.profile import stages, sweeps
from mmtrt.runtime import load

# What lies between the stages is a few Python statements: the stated margin is 5 % of the wall time.
MARGIN = 0.05


@pytest.fixture(scope="module")
def pipe(tiny_bundle):
    return load(tiny_bundle, threads=1, spin=False)


@pytest.mark.parametrize("batch", [1, 3])
def test_stage_times_add_up_to_the_wall_time(pipe, rng, batch):
    image = random_image(rng, int(rng.integers(30, 150)), int(rng.integers(30, 150)))
    for _ in range(3):
        r = stages.request(pipe, image, "Describe it in a few words.", 6, batch)
        total = sum(r["ms"].values())
        assert set(r["ms"]) == set(stages.STAGES)
        assert total <= r["wall_ms"] and r["wall_ms"] - total <= MARGIN * r["wall_ms"]


def test_kv_bytes_per_stage_are_the_cache_the_model_facts_give(pipe, rng):
    r = stages.request(pipe, random_image(rng, 64, 64), "Hi", 5, 2)
    assert r["kv_bytes"]["prefill"] == sweeps.kv_bytes(pipe, r["prompt_tokens"], 2)
    assert r["kv_bytes"]["decode"] == sweeps.kv_bytes(pipe, r["prompt_tokens"] + 4, 2)
    assert all(v is None or v > 0 for v in r["peak_rss_bytes"].values())


PEAK_PROBE = """
import json, numpy as np
from mmtrt.profile import stages
clock = stages.Clock()
with clock("big"):
    big = np.ones(256 * 2**20 // 8)
    del big
with clock("small"):
    block = np.ones(64 * 2**20 // 8)
    del block
print(json.dumps({"rss": clock.rss, "growth": clock.growth}))
"""


def test_peak_rss_is_reset_between_stages_and_sees_a_stage_allocation():
    """Each stage's peak is its own: a small stage after a big one does not inherit the big one's peak. Run in a
    fresh process: in the suite's long-lived one, freed pools and other threads blur the kernel's RSS counters."""
    out = json.loads(subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["rss"]["small"] < out["rss"]["big"] - 150 * 2**20
    assert out["growth"]["small"] >= 60 * 2**20


def test_measure_splits_vision_and_reports_throughput(pipe, rng):
    row, again = stages.measure([pipe, pipe], random_image(rng, 50, 60), "What?", 4, 2, 2)
    assert again["wall_ms"]["rounds"] == row["wall_ms"]["rounds"] == 2
    vision = row["stages"]["vision"]["median"]
    stages.split_vision(row["stages"], 0.25)
    assert list(row["stages"])[2:4] == ["vision_encoder", "projector"]
    assert row["stages"]["projector"]["median"] == pytest.approx(0.25 * vision)
    assert row["stages"]["vision_encoder"]["median"] + row["stages"]["projector"]["median"] == pytest.approx(vision)
    assert row["requests_per_s"] == pytest.approx(2e3 / row["wall_ms"]["median"])
    assert sum(v["share"] for v in row["stages"].values()) == pytest.approx(1)


def test_requests_beyond_the_envelope_are_refused(pipe):
    with pytest.raises(UserError, match="envelope.batch"):
        stages.check_request(pipe, pipe.dims["batch"]["max"] + 1, 4)
    with pytest.raises(UserError, match="new-tokens"):
        stages.check_request(pipe, 1, pipe.manifest["envelope"]["max_new_tokens"] + 1)


def test_context_sweep_measures_within_capacity_only(pipe, rng):
    capacity = pipe.dims["past + seq"]["max"]
    rows = sweeps.context_sweep(pipe, [16, capacity, capacity + 1], 2, rng)
    assert [r["kv_bytes_measured"] for r in rows[:2]] == [r["kv_bytes"] for r in rows[:2]]
    assert all(r["decode_step_ms"] > 0 for r in rows[:2])
    assert rows[2]["decode_step_ms"] is None and "capacity" in rows[2]["why_not_measured"]


def test_prefill_at_keeps_thins_only_image_tokens(pipe, rng):
    ids = np.array([pipe.prompt_ids("Count the shapes.")], np.int64)
    embeds = pipe.embed(ids, pipe.image_features(pipe.pixel_values(random_image(rng, 64, 64))))
    rows = sweeps.prefill_at_keeps(pipe, embeds, ids, (1.0, 0.25), 2)
    text = ids.shape[1] - pipe.model["vision"]["image_tokens"]
    assert [r["image_tokens"] for r in rows] == [64, 16]
    assert [r["sequence"] for r in rows] == [text + 64, text + 16]
