"""ONNX Runtime's uint8 x int8 GEMM on this host: its products equal the exact integer sum where `saturates()` says
no, and the 16-bit saturating sum of neighbouring products where it says yes; a bundle with int8 linears says so
in one warning at load on a host whose GEMM saturates, and a bundle without them says nothing."""

import json
import logging

import numpy as np

from int8_gemm_reference import host_integer_product
from mmtrt.backends.int8_gemm import integer_linears, integer_product, saturates
from mmtrt.runtime.pipeline import load


def test_the_probe_says_how_this_hosts_gemm_adds(rng):
    a = rng.integers(0, 256, size=(24, 320)).astype(np.uint8)
    b = rng.integers(-127, 128, size=(320, 48)).astype(np.int8)
    exact = (a.astype(np.int64) - 128) @ b.astype(np.int64)
    got = integer_product(a, b)
    assert np.array_equal(got, host_integer_product(a, b))
    assert np.array_equal(got, exact) == (not saturates())


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_bundle_with_int8_linears_warns_where_they_saturate(tiny_prefill_bundle, tiny_bundle):
    manifest = json.loads((tiny_prefill_bundle / "manifest.json").read_text())
    assert integer_linears(manifest) == ["int8_prefill"]
    for bundle, warned in ((tiny_prefill_bundle, saturates()), (tiny_bundle, False)):
        kept = _Kept()
        logging.getLogger("mmtrt.runtime").addHandler(kept)
        try:
            load(bundle)
        finally:
            logging.getLogger("mmtrt.runtime").removeHandler(kept)
        notes = [m for m in kept.messages if "VNNI" in m]
        assert len(notes) == warned and all("int8_prefill linears" in n and "compile a recipe" in n for n in notes)


def test_a_passes_record_in_another_form_names_no_integer_linears():
    """The manifest's record of its passes is informational: an edited one must not fail a load."""
    good = {"pass": "int8_weights", "config": {"activations": "dynamic"}}
    for passes in (None, 3, "x", [{}], [7], [{"pass": "int8_weights", "config": 3}], [{"config": {}}]):
        assert integer_linears({"passes": passes}) == []
    assert integer_linears({"passes": [{}, good, {"pass": "int8_prefill"}]}) == ["int8_weights", "int8_prefill"]
