"""Train dino-smollm's projector (LLaVA's first stage): both towers frozen, only the two-layer MLP learns.

The frozen DINOv2 features are computed once; each step then runs SmolLM2 forward and backward with bf16
autocast (AVX512-BF16 makes it about 4x faster than fp32 on our machines) to reach the projector's gradient.
The loss is the answer's next-token loss ("7" then <|im_end|>) after the chat-formatted prompt. Weights are kept
in fp32 and saved as fp32; inference uses fp32. Same seed, same weights (one thread, so reductions keep their
order).

With --token-drop KEEP... (zoo:dino-smollm-tokendrop) every batch draws one of the keep ratios and every sample
keeps a random subset of its image tokens at that ratio, in their original order, with the prompt's placeholder
run shortened to the kept count: the sequence the runtime builds after token_prune. The LLM thus learns to read
subsets of the image tokens (VisionZip fine-tunes the projector for its budget); random subsets favour no pruning
criterion. The ratio is drawn per batch, not per sample, so a batch needs no padding and every sequence is exactly
what inference sees. The drops have their own generator, so the sample order is the default run's.
The committed variant uses keeps 1 and 0.5: with 1, 0.5, 0.25 and 0.125 the held-out first-token accuracy at all
64 tokens fell to 64.0 % (from 94.2): 8 or 16 random patches of a digit, most of them background, cannot name it,
their loss dominates, and one per-token MLP serves every budget.

--select METHOD... draws, per batch, which of token_prune's criteria picks the kept tokens (`random` per sample,
`cls_attention` from the tower's own [CLS] attention at the feature layer, `norm` from the features' L2 norms,
each exactly as the pass scores them), so the projector learns every criterion's selections alike and the
benchmark compares the criteria, not the training. --page 224 (zoo:dino-smollm-page) trains a 224 px model on the
digit centred on a white page (mmtrt.eval.digits). The committed page variant uses keeps 1, 0.5 and 0.25: adding
0.125 cut its held-out accuracy at all 256 tokens from 92.4 % to 73.0 %, as random keeps of 32 patches mostly miss
the digit.

    python scripts/train_projector.py --epochs 4 --lr 5e-4                      # zoo:dino-smollm
    python scripts/train_projector.py --epochs 4 --lr 5e-4 --token-drop 1 0.5   # zoo:dino-smollm-tokendrop
    python scripts/train_projector.py --page 224 --epochs 4 --lr 5e-4 --token-drop 1 0.5 0.25 \
        --select random cls_attention norm                                      # zoo:dino-smollm-page
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from mmtrt.eval.digits import PROMPT, samples
from mmtrt.zoo.dino_smollm import IMAGE_SIZE, PAGE_PROJECTOR, PROJECTOR, TOKEN_DROP_PROJECTOR, assemble

SEED = 0
SELECT = ("random", "cls_attention", "norm")
THREADS = 1  # two OpenMP threads on a shared two-core machine stall at every barrier; one thread is steadier


def log(path: Path, **record) -> None:
    print(json.dumps(record), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


@torch.no_grad()
def tower_features(model, processor, images, with_attention: bool = False, batch: int = 16):
    """The feature layer's patch tokens (the projector's input) for every image and, with_attention, the
    attention [CLS] pays each of them at that layer, mean over heads (token_prune's cls_attention score; it needs
    eager attention, so only runs that select by it pay for it, and the other projectors' features stay as
    they were trained)."""
    tower = model.model.vision_tower
    layer = model.config.vision_feature_layer % (model.config.vision_config.num_hidden_layers + 1) - 1
    previous = tower.config._attn_implementation
    if with_attention:
        tower.set_attn_implementation("eager")
    features, attention = [], []
    try:
        for i in range(0, len(images), batch):
            pixels = processor.image_processor(images=images[i:i + batch], return_tensors="pt")["pixel_values"]
            out = tower(pixels, output_hidden_states=True, output_attentions=with_attention)
            features.append(out.hidden_states[model.config.vision_feature_layer][:, 1:])
            if with_attention:
                attention.append(out.attentions[layer][:, :, 0, 1:].mean(1))
    finally:
        tower.set_attn_implementation(previous)
    return torch.cat(features), torch.cat(attention) if with_attention else None


def prompt_ids(processor) -> tuple[list[int], int]:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    ids = processor(text=text, images=samples("train", 1)[0][0])["input_ids"][0]
    return list(ids), processor.tokenizer.eos_token_id


def sequence_embeddings(model, prompt: list[int], answers: torch.Tensor, eos: int, features: torch.Tensor):
    """Embeddings of prompt + answer + eos for a batch, with the projected image tokens spliced in."""
    batch = len(answers)
    ids = torch.tensor(prompt).repeat(batch, 1)
    ids = torch.cat([ids, answers[:, None], torch.full((batch, 1), eos)], 1)
    embeds = model.get_input_embeddings()(ids)
    projected = model.model.multi_modal_projector(features)
    mask = ids == model.config.image_token_id
    embeds = embeds.masked_scatter(mask[..., None], projected.to(embeds.dtype))
    return embeds, ids[:, -2:]


def expand_placeholder(prompt: list[int], image_token: int, count: int) -> list[int]:
    """The prompt with its run of image placeholders replaced by `count` of them, as the runtime expands it."""
    start = prompt.index(image_token)
    text = [t for t in prompt if t != image_token]
    return text[:start] + [image_token] * count + text[start:]


def selection_scores(method: str, features: torch.Tensor, attention: torch.Tensor, gen: torch.Generator):
    """Per sample and token, the score token_prune ranks by; `random` is a fresh uniform draw per sample."""
    if method == "random":
        return torch.rand(features.shape[:2], generator=gen)
    if method == "cls_attention":
        return attention
    return features.float().norm(dim=-1)


def drop_tokens(features: torch.Tensor, scores: torch.Tensor, count: int) -> torch.Tensor:
    """Per sample, its `count` best-scored image tokens, kept in their original order."""
    kept = scores.topk(count, dim=1).indices.sort(dim=1).values
    return features.gather(1, kept[..., None].expand(-1, -1, features.shape[2]))


def draw(options: list, gen: torch.Generator):
    return options[int(torch.randint(len(options), (1,), generator=gen))]


def token_drop_batch(prompt: list[int], image_token: int, features: torch.Tensor, attention: torch.Tensor,
                     args, gen: torch.Generator):
    """A batch's prompt and image tokens at a keep ratio drawn from --token-drop (counted as token_prune counts),
    chosen by a criterion drawn from --select."""
    keep = draw(args.token_drop, gen)
    # a single criterion draws nothing, so --token-drop alone replays the committed tokendrop run's draws
    method = draw(args.select, gen) if len(args.select) > 1 else args.select[0]
    count = max(1, round(keep * features.shape[1]))
    scores = selection_scores(method, features, attention, gen)
    return expand_placeholder(prompt, image_token, count), drop_tokens(features, scores, count)


def answer_logits(model, embeds) -> torch.Tensor:
    return model(inputs_embeds=embeds, logits_to_keep=3).logits[:, :2].float()


def train(args) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    model, processor = assemble(image_size=args.page)
    for p in model.parameters():
        p.requires_grad_(False)
    projector = model.model.multi_modal_projector
    for p in projector.parameters():
        p.requires_grad_(True)
    log_path = args.out.with_suffix(".log.jsonl")
    log_path.unlink(missing_ok=True)
    prompt, eos = prompt_ids(processor)
    digit_ids = torch.tensor([processor.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    train_set = samples("train", page=args.page)
    started = time.perf_counter()
    features, attention = tower_features(model, processor, [img for img, _ in train_set],
                                         with_attention="cls_attention" in args.select)
    labels = torch.tensor([label for _, label in train_set])
    log(log_path, event="features", count=len(labels), seconds=round(time.perf_counter() - started, 1))

    steps = args.epochs * math.ceil(len(labels) / args.batch)
    opt = torch.optim.AdamW(projector.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    gen = torch.Generator().manual_seed(SEED)
    drop_gen = torch.Generator().manual_seed(SEED + 1)
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(labels), generator=gen)
        for i in range(0, len(order), args.batch):
            idx = order[i:i + args.batch]
            batch_prompt, batch_features = prompt, features[idx]
            if args.token_drop:
                batch_prompt, batch_features = token_drop_batch(prompt, model.config.image_token_id, batch_features,
                                                                attention[idx], args, drop_gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                embeds, targets = sequence_embeddings(model, batch_prompt, digit_ids[labels[idx]], eos, batch_features)
                logits = answer_logits(model, embeds)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0 or step == steps:
                log(log_path, event="step", epoch=epoch, step=step, of=steps, loss=round(loss.item(), 4),
                    lr=round(sched.get_last_lr()[0], 6), seconds=round(time.perf_counter() - started, 1))
    state = {k: v.detach().float().contiguous() for k, v in projector.state_dict().items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"seed": str(SEED), "epochs": str(args.epochs), "lr": str(args.lr), "batch": str(args.batch),
                "train_images": str(len(labels))}
    if args.token_drop:
        metadata["token_drop_keep"] = ",".join(map(str, args.token_drop))
        metadata["token_drop_select"] = ",".join(args.select)
    if args.page != IMAGE_SIZE:
        metadata["page"] = str(args.page)
    save_file(state, args.out, metadata=metadata)
    accuracy = heldout_first_token_accuracy(model, processor, prompt, digit_ids, args.page)
    log(log_path, event="done", heldout_first_token_accuracy=accuracy, seconds=round(time.perf_counter() - started, 1))


@torch.no_grad()
def heldout_first_token_accuracy(model, processor, prompt, digit_ids, page: int, batch: int = 16) -> float:
    """A quick fp32 check: the answer's first token, argmax over the whole vocabulary, on the held-out split."""
    heldout = samples("heldout", page=page)
    correct = 0
    for i in range(0, len(heldout), batch):
        chunk = heldout[i:i + batch]
        feats, _ = tower_features(model, processor, [img for img, _ in chunk])
        ids = torch.tensor(prompt).repeat(len(chunk), 1)
        embeds = model.get_input_embeddings()(ids)
        mask = ids == model.config.image_token_id
        embeds = embeds.masked_scatter(mask[..., None], model.model.multi_modal_projector(feats))
        first = model(inputs_embeds=embeds, logits_to_keep=1).logits[:, -1].argmax(-1)
        correct += int((first == digit_ids[torch.tensor([label for _, label in chunk])]).sum())
    return round(100 * correct / len(heldout), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--token-drop", nargs="+", type=float, metavar="KEEP",
                        help="train on random subsets of the image tokens, a keep ratio in (0, 1] drawn per batch")
    parser.add_argument("--select", nargs="+", default=["random"], choices=SELECT, metavar="METHOD",
                        help=f"with --token-drop: the criteria that pick the kept tokens, one drawn per batch "
                        f"({', '.join(SELECT)}; default random)")
    parser.add_argument("--page", type=int, default=IMAGE_SIZE,
                        help=f"the model's input side; above {IMAGE_SIZE} the digit sits on a white page of that size")
    parser.add_argument("--out", type=Path, help=f"default: {PROJECTOR.name}, {TOKEN_DROP_PROJECTOR.name} with "
                        f"--token-drop, {PAGE_PROJECTOR.name} with --page")
    args = parser.parse_args()
    if args.token_drop and not all(0 < keep <= 1 for keep in args.token_drop):
        parser.error(f"--token-drop takes keep ratios in (0, 1], got {args.token_drop}")
    if args.select != ["random"] and not args.token_drop:
        parser.error("--select needs --token-drop")
    default = PAGE_PROJECTOR if args.page != IMAGE_SIZE else TOKEN_DROP_PROJECTOR if args.token_drop else PROJECTOR
    args.out = args.out or default
    train(args)


if __name__ == "__main__":
    main()
