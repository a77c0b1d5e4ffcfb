"""An image placeholder's id repeated after tokenizing gives the ids of the text with the placeholder repeated (how
LlavaProcessor tokenizes), for the bundle's tokenizer and transformers' alike, on random text around it."""

from transformers import AutoTokenizer

from mmtrt.runtime.prompt import expanded_ids
from mmtrt.runtime.tokenizer import BundleTokenizer

PIECES = [" ", "  ", "\n", "a", "image", "<", ">", "<image", "image>", "é", "日本", "\U0001F600", "<|im_start|>",
          "<|im_end|>", "\t", "Describe it.", "0", "."]


def random_text(rng, placeholder: str, images: int) -> str:
    parts = [str(rng.choice(PIECES)) for _ in range(int(rng.integers(0, 12)))]
    for _ in range(images):
        parts.insert(int(rng.integers(0, len(parts) + 1)), placeholder)
    return "".join(parts)


def test_repeated_placeholder_ids_equal_the_repeated_text_ids(tiny_bundle, rng):
    folder = tiny_bundle / "tokenizer"
    tokenizers = [BundleTokenizer(folder), AutoTokenizer.from_pretrained(folder)]
    for _ in range(40):
        images, count = int(rng.integers(1, 4)), int(rng.integers(1, 50))
        text, add = random_text(rng, "<image>", images), bool(rng.integers(0, 2))
        for tok in tokenizers:
            expected = tok(text.replace("<image>", "<image>" * count), add_special_tokens=add)["input_ids"]
            assert expanded_ids(tok, text, "<image>", count, add) == expected, text


def test_a_placeholder_that_is_not_an_added_token_is_expanded_as_text(tiny_bundle, rng):
    tok = BundleTokenizer(tiny_bundle / "tokenizer")
    assert all(t.content != "ab" for t in tok.added_tokens_decoder.values())
    for _ in range(10):
        text, count = random_text(rng, "ab", 2), int(rng.integers(2, 6))
        assert expanded_ids(tok, text, "ab", count, False) == tok(text.replace("ab", "ab" * count),
                                                                  add_special_tokens=False)["input_ids"]
