"""Speculative decoding with the prompt-lookup draft: greedy tokens equal plain decoding's on every KV layout, in
batches, with an image prefix reused, with EOS and stop strings inside an accepted run, and after heavy rejection."""

import dataclasses
import json
import subprocess
import sys

import pytest

from builders import random_image
from conftest import ROOT, compile_to
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.serving_loop import ServingLoop

LOOKUP = {"draft": "prompt_lookup", "k": 4, "max_ngram": 3}
PROMPTS = ["What is in the picture?", "Describe the image in detail.", "one two three one two three one two"]


@pytest.fixture(scope="module", params=["hf", "static", "paged"])
def bundle(request):
    return request.getfixturevalue("tiny_bundle" if request.param == "hf" else f"tiny_{request.param}_bundle")


def both(pipe, image, prompts, new=24, **sampling):
    """Each prompt's Generation without and with the draft, on the same pipeline."""
    params = SamplingParams(**sampling) if sampling else None
    pipe.speculative = None
    plain = [pipe.generate(image, p, new, sampling=params) for p in prompts]
    pipe.speculative = LOOKUP
    return plain, [pipe.generate(image, p, new, sampling=params) for p in prompts]


def test_greedy_tokens_equal_plain_decoding_and_drafts_are_accepted(bundle, rng):
    """The random tiny model's answers repeat an n-gram of their prompt or of themselves for about 7 images in 8
    (none of the three prompts' drafts was accepted for the eighth); images are drawn until one has a draft
    accepted, each checked against plain decoding."""
    pipe = load(bundle, prefix_cache_mib=0)
    accepted = 0
    for _ in range(6):
        plain, spec = both(pipe, random_image(rng, 64, 64), PROMPTS)
        assert [g.token_ids for g in spec] == [g.token_ids for g in plain]
        assert [g.finish_reason for g in spec] == [g.finish_reason for g in plain]
        assert all(g.speculative["accepted"] <= g.speculative["proposed"] for g in spec)
        assert all(g.speculative is None for g in plain)
        accepted = sum(g.speculative["accepted"] for g in spec)
        if accepted:
            break
    assert accepted > 0


def test_a_batch_with_different_acceptance_gives_every_request_its_solo_tokens(bundle, rng):
    pipe = load(bundle, prefix_cache_mib=0)
    images = [random_image(rng, 64, 64) for _ in PROMPTS]
    solo = [pipe.generate(image, p, 20).token_ids for image, p in zip(images, PROMPTS)]
    requests = [Request(image, p, 20) for image, p in zip(images, PROMPTS)]
    pipe.speculative = LOOKUP
    assert [g.token_ids for g in pipe.generate_batch(requests)] == solo
    # request i's draft is right for its first 4 * i tokens only, so each accepts a different number
    pipe.speculative = {"draft": PerRequest([t[:4 * i] + [(x + 1) % vocab(pipe) for x in t[4 * i:]]
                                             for i, t in enumerate(solo)]), "k": 4}
    batch = pipe.generate_batch(requests)
    assert [g.token_ids for g in batch] == solo
    for g, tokens, accepted in zip(batch, solo, [0, 3, 6]):  # 2: 4 in its first step, 2 in its second
        assert g.speculative["accepted"] == accepted if len(tokens) == 20 else g.speculative["accepted"] <= accepted


def test_one_verification_call_per_step_on_paged_with_eos_limits_and_rejection_inside_the_batch(
        tiny_paged_bundle, rng):
    """Paged verifies every running sequence's draft in one call, padded to the longest: requests of different
    token limits (the padding is cut near each one's limit), one whose EOS falls inside an accepted run, one whose
    drafts are all rejected, and one with no draft at all in some steps, each gives its solo tokens."""
    pipe = load(tiny_paged_bundle, prefix_cache_mib=0)
    prompts, limits = PROMPTS + PROMPTS[:1], [24, 7, 24, 13]
    for _ in range(40):  # images the model's own EOS ends no answer for, whose new EOS (request 2's 10th token)
        images = [random_image(rng, 64, 64) for _ in range(4)]  # ends no other request early
        answers = [pipe.generate(i, p, 24).token_ids for i, p in zip(images, prompts)]
        stop = answers[2][9] if all(len(a) == 24 for a in answers) else None
        if stop is not None and stop not in answers[2][:9] + answers[0] + answers[1][:7] + answers[3][:13]:
            break
    else:
        pytest.fail("no random images in 40 gave answers of 24 tokens with a usable 10th token")
    eos, pipe.model["eos_token_ids"] = pipe.model["eos_token_ids"], [stop]
    try:
        solo = [pipe.generate(i, p, n).token_ids for i, p, n in zip(images, prompts, limits)]
        assert len(solo[2]) == 10 and solo[2][-1] == stop
        v = vocab(pipe)
        drafts = [answers[0], answers[1], answers[2], [(t + 1) % v for t in answers[3]]]  # the last: all rejected
        pipe.speculative = {"draft": PerRequest(drafts, silent={0: range(3, 9)}), "k": 8}
        calls = []
        run = pipe.stepper.run

        def counted(embeds, seqs, last_only, *args, **kwargs):
            calls.append((len(seqs), embeds.shape[1], last_only))
            return run(embeds, seqs, last_only, *args, **kwargs)
        pipe.stepper.run = counted
        batch = pipe.generate_batch([Request(i, p, n) for i, p, n in zip(images, prompts, limits)])
    finally:
        pipe.model["eos_token_ids"] = eos
    assert [g.token_ids for g in batch] == solo
    assert batch[3].speculative["accepted"] == 0 and batch[0].speculative["accepted"] > 0
    verifications = [(n, width) for n, width, last_only in calls if not last_only]
    # all four at once; the request of 7 tokens holds one and may take 6 more, which caps the width at 7 (the last
    # token and 6 drafted); once it has finished, drafts of 8 are verified whole
    assert verifications[0] == (4, 7) and (3, 9) in verifications


class Continuation:
    """A draft that proposes a known answer's next tokens (`shift` 0: all accepted), or tokens that differ from
    them (`shift` > 0: every one rejected)."""

    def __init__(self, answer, vocab, shift=0):
        self.answer, self.vocab, self.shift = answer, vocab, shift

    def propose(self, seq, count, _row):
        ahead = self.answer[len(seq.tokens):len(seq.tokens) + count]
        return [(t + self.shift) % self.vocab for t in ahead], None

    def commit(self, seq, kept):
        pass


class PerRequest(Continuation):
    """Each request (by its index) drafted from an answer of its own; `silent`: the request's token counts at
    which it proposes nothing."""

    def __init__(self, answers, silent=None):
        self.answers, self.silent = answers, silent or {}

    def propose(self, seq, count, _row):
        if len(seq.tokens) in self.silent.get(seq.prep.index, ()):
            return [], None
        tokens = self.answers[seq.prep.index]
        return tokens[len(seq.tokens):len(seq.tokens) + count], None


def all_accepted_until(eos_at, limit, k):
    """Drafted tokens accepted when every one is right up to the EOS at index `eos_at` (the first token comes from
    the prefill; a step proposes min(k, limit - tokens - 1) and adds the target's own token after a full run)."""
    emitted, accepted = 1, 0
    while emitted <= eos_at:
        drafted = min(k, limit - emitted - 1)
        if drafted <= 0:  # no room for a draft: a plain step
            emitted += 1
            continue
        if eos_at < emitted + drafted:
            return accepted + eos_at - emitted + 1
        accepted, emitted = accepted + drafted, emitted + drafted + 1
    return accepted


def vocab(pipe):
    return pipe.model["llm"]["vocab_size"]


def test_a_request_after_heavy_rejection_gives_its_solo_answer(bundle, rng):
    """Long drafts that are all rejected leave KV past the kept length; the next requests must not see it."""
    pipe, image = load(bundle, prefix_cache_mib=0), random_image(rng, 64, 64)
    solo = [pipe.generate(image, p, 24).token_ids for p in PROMPTS]
    pipe.speculative = {"draft": Continuation(solo[1] + [0] * 16, vocab(pipe), shift=1), "k": 16}
    heavy = pipe.generate(image, PROMPTS[1], 24)
    assert heavy.token_ids == solo[1]
    assert heavy.speculative["accepted"] == 0 and heavy.speculative["proposed"] > 16  # the first step drafts 16
    pipe.speculative = {**LOOKUP, "k": 16}
    assert [pipe.generate(image, p, 24).token_ids for p in PROMPTS] == solo
    batch = pipe.generate_batch([Request(image, p, 24) for p in PROMPTS])
    assert [g.token_ids for g in batch] == solo


def test_later_questions_on_an_image_reuse_its_prefix_and_equal_fresh_plain_runs(tiny_static_bundle, rng):
    pipe, fresh = load(tiny_static_bundle), load(tiny_static_bundle, prefix_cache_mib=0)
    image = random_image(rng, 64, 64)
    pipe.speculative = LOOKUP
    ours = [pipe.generate(image, p, 20).token_ids for p in PROMPTS]
    assert ours == [fresh.generate(image, p, 20).token_ids for p in PROMPTS]
    assert pipe.prefixes.hits == len(PROMPTS) - 1


def test_eos_inside_an_accepted_run_ends_the_answer_where_plain_decoding_does(bundle, rng):
    """Each token of the answer in turn is made the end-of-sequence token while a draft proposes the whole
    answer: the EOS is accepted inside a run whose later tokens must not be emitted."""
    pipe, image = load(bundle, prefix_cache_mib=0), random_image(rng, 64, 64)
    answer = pipe.generate(image, PROMPTS[2], 24).token_ids
    eos = pipe.model["eos_token_ids"]
    for token in dict.fromkeys(answer[1:]):
        pipe.model["eos_token_ids"] = [token]
        pipe.speculative = None
        plain = pipe.generate(image, PROMPTS[2], 24)
        pipe.speculative = {"draft": Continuation(answer, vocab(pipe)), "k": 8}
        spec = pipe.generate(image, PROMPTS[2], 24)
        assert (spec.token_ids, spec.finish_reason) == (plain.token_ids, plain.finish_reason)
        assert spec.token_ids == answer[:answer.index(token) + 1] and spec.finish_reason == "stop"
        assert spec.speculative["accepted"] == all_accepted_until(answer.index(token), 24, 8)
    pipe.model["eos_token_ids"] = eos


def answer_with_stops(pipe, rng, tries=8):
    """An image, its answer, and up to four stop strings: printable characters of the answer after its first one
    (random weights often write bytes that are no character; images are drawn until two such are found)."""
    for _ in range(tries):
        image = random_image(rng, 64, 64)
        answer = pipe.generate(image, PROMPTS[2], 24)
        stops = [c for c in dict.fromkeys(answer.text[1:]) if c.isprintable() and c != "\ufffd"][:4]
        if len(stops) >= 2:
            return image, answer, stops
    raise AssertionError(f"no answer of {tries} images held two printable characters")


@pytest.mark.parametrize("draft", ["continuation", "lookup"])
def test_stop_strings_inside_an_accepted_run_cut_the_text_where_plain_decoding_does(bundle, rng, draft):
    pipe = load(bundle, prefix_cache_mib=0)
    image, plain_full, stops = answer_with_stops(pipe, rng)
    config = {"draft": Continuation(plain_full.token_ids, vocab(pipe)), "k": 8} if draft == "continuation" else LOOKUP
    for stop in stops:
        params = SamplingParams(stop=(stop,))
        pipe.speculative = None
        plain = pipe.generate(image, PROMPTS[2], 24, sampling=params)
        pipe.speculative = config
        spec = pipe.generate(image, PROMPTS[2], 24, sampling=params)
        assert (spec.text, spec.token_ids, spec.finish_reason) == (plain.text, plain.token_ids, "stop")
        assert stop not in spec.text


@pytest.fixture(scope="module")
def lookup_bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "envelope:", "  - speculative: {draft: prompt_lookup, k: 4}\nenvelope:")
    return compile_to(tmp_path_factory.mktemp("tiny-lookup"), recipe, "lookup.bundle")


def test_the_pass_puts_the_draft_in_the_bundle_and_run_json_reports_it(lookup_bundle, tiny_bundle, rng):
    pipe = load(lookup_bundle)
    assert pipe.speculative == LOOKUP
    image = ROOT / "examples" / "sample.png"
    out = subprocess.run([sys.executable, "-m", "mmtrt.cli", "run", str(lookup_bundle), "--image", str(image),
                          "--prompt", PROMPTS[2], "--max-new-tokens", "24", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.stdout)
    assert result["token_ids"] == load(tiny_bundle).generate(str(image), PROMPTS[2], 24).token_ids
    assert set(result["speculative"]) == {"proposed", "accepted"} and result["speculative"]["proposed"] > 0


def test_sampling_with_the_draft_keeps_the_seed_reproducible(tiny_bundle, rng):
    pipe, image = load(tiny_bundle, prefix_cache_mib=0), random_image(rng, 64, 64)
    pipe.speculative = LOOKUP
    params = SamplingParams(temperature=0.7, top_k=20, seed=11)
    first, again = (pipe.generate(image, PROMPTS[2], 20, sampling=params) for _ in range(2))
    assert first.token_ids == again.token_ids and first.speculative == again.speculative
    other = pipe.generate(image, PROMPTS[2], 20, sampling=dataclasses.replace(params, seed=12))
    assert other.token_ids != first.token_ids


def test_the_serving_loop_speculates_per_request_and_reports_the_running_acceptance_rate(tiny_paged_bundle, rng):
    pipe = load(tiny_paged_bundle, prefix_cache_mib=0)
    images = [random_image(rng, 64, 64) for _ in PROMPTS]
    solo = [pipe.generate(image, p, 24).token_ids for image, p in zip(images, PROMPTS)]
    pipe.speculative = LOOKUP
    with ServingLoop(pipe) as loop:
        assert loop.metrics().speculative_acceptance is None  # nothing proposed yet
        handles = [loop.submit(Request(image, p, 24)) for image, p in zip(images, PROMPTS)]
        results = [h.result(timeout=300) for h in handles]
        metrics = loop.metrics()
    assert [r.token_ids for r in results] == solo
    proposed = sum(r.speculative["proposed"] for r in results)
    accepted = sum(r.speculative["accepted"] for r in results)
    assert accepted > 0 and metrics.speculative_acceptance == pytest.approx(accepted / proposed)
    assert metrics.tokens_generated == sum(len(t) for t in solo)


def test_an_early_exit_draft_on_a_bundle_without_one_is_refused_and_the_bundle_still_decodes(tiny_bundle):
    pipe = load(tiny_bundle, prefix_cache_mib=0)
    pipe.speculative = {"draft": "early_exit", "k": 4}
    with pytest.raises(UserError, match="no early-exit draft.*speculative: {draft: early_exit"):
        pipe.generate(None, PROMPTS[0], 4)
    pipe.speculative = None
    assert len(pipe.generate(None, PROMPTS[0], 4).token_ids) == 4
