"""What LLaVA-NeXT and LLaVA-OneVision share: any-resolution tiling (`mmtrt.preprocess.anyres`).

The vision component is LLaVA's (tower, feature select, projector) run on every tile of an image at once, so the
vision passes see a LLaVA vision graph whose batch is the tiles. Laying the tiles' features out (unpadding,
OneVision's pooling, the `image_newline` ending each row) is integer indexing the runtime does from the image's
size; the newline vector travels as the asset `vision/image_newline.npy`. Facts: `vision.tile_tokens` per tile,
`vision.image_tokens` the most an image takes in the envelope, `vision.anyres` the layout (see the backend module).
"""

from __future__ import annotations

import copy
import io
from typing import Any

import numpy as np

from mmtrt.preprocess.anyres import NEWLINE_ASSET, token_bound
from mmtrt.errors import UserError
from mmtrt.ir import export
from mmtrt.ir.families.common import FRONTEND_PROPERTIES, language_components, lowered, tokenizer_assets
from mmtrt.ir.families.llava import llava_style_facts
from mmtrt.ir.graph import Component, ModelIR, TensorSpec
from mmtrt.ir.preprocess import spec_from_image_processor


def anyres_facts(config, generation_config, processor, spec: dict[str, Any], max_patches: int | None) -> dict[str, Any]:
    """The model facts of an any-resolution LLaVA; `max_patches` is OneVision's anyres_max (None: no pooling)."""
    vision = config.vision_config
    tiling = spec.get("tiling")
    if tiling is None:
        raise UserError(f"{type(processor.image_processor).__name__} does not tile images; a {config.model_type} "
                        "checkpoint needs its any-resolution image processor")
    grid = vision.image_size // vision.patch_size
    pinpoints = [[int(h), int(w)] for h, w in config.image_grid_pinpoints]
    _check_tiles(config, tiling, spec, pinpoints)
    anyres = {"pinpoints": pinpoints, "tile": vision.image_size, "grid": grid, "max_patches": max_patches,
              "layout": "grid", "max_tiles": max(h * w for h, w in pinpoints) // vision.image_size ** 2}
    return llava_style_facts(config, generation_config, processor, spec, config.model_type, tile_tokens=grid * grid,
                             image_tokens=token_bound(anyres, grid * grid), anyres=anyres)


def _check_tiles(config, tiling: dict[str, Any], spec: dict[str, Any], pinpoints: list[list[int]]) -> None:
    """The processor must cut the tiles the model lays out: same grid resolutions, tiles of the tower's size."""
    side = config.vision_config.image_size
    if tiling["pinpoints"] != pinpoints:
        raise UserError(f"the image processor's image_grid_pinpoints {tiling['pinpoints']} differ from the model "
                        f"config's {pinpoints}; save the processor that belongs to the model")
    if tiling["tile"] != [side, side] or list(spec["output_size"]) != [side, side]:
        raise UserError(f"the image processor cuts {tiling['tile']} tiles into {spec['output_size']} inputs but the "
                        f"vision tower takes {side}x{side}; save the processor that belongs to the model")
    if any(h % side or w % side for h, w in pinpoints):
        raise UserError(f"image_grid_pinpoints {pinpoints} are not multiples of the {side}-pixel tile; fix the config")


def fit_envelope(facts: dict[str, Any], envelope) -> dict[str, Any]:
    """`envelope.image.max_tiles` bounds the grid an image may be cut into, so the image tokens, the sequence and
    the KV cache; images needing more tiles are refused at run time."""
    wanted = envelope.image.max_tiles
    if wanted is None:
        return facts
    anyres = facts["vision"]["anyres"]
    fewest = min(h * w for h, w in anyres["pinpoints"]) // anyres["tile"] ** 2
    if wanted < fewest:
        raise UserError(f"envelope.image.max_tiles is {wanted} but every image of this model is cut into at least "
                        f"{fewest} tiles; set max_tiles to {fewest} or more")
    out = copy.deepcopy(facts)
    out["vision"]["anyres"]["max_tiles"] = min(wanted, anyres["max_tiles"])
    out["vision"]["image_tokens"] = token_bound(out["vision"]["anyres"], out["vision"]["tile_tokens"])
    return out


def lower(model, processor, max_patches: int | None) -> ModelIR:
    """Export every component to ONNX and assemble the IR; the newline vector becomes an asset."""
    spec = spec_from_image_processor(processor.image_processor)
    facts = anyres_facts(model.config, model.generation_config, processor, spec, max_patches)
    v = facts["vision"]
    size = tuple(spec["output_size"])
    vision = lowered("vision", v, lambda: export.export_vision(model, v["feature_layer"], v["select_strategy"], size),
                     export.vision_modules(model))
    if vision.outputs[0].shape[1] != v["tile_tokens"]:
        raise UserError(f"the vision tower yields {vision.outputs[0].shape[1]} tokens per tile but the any-resolution "
                        f"layout needs {v['tile_tokens']} (a {v['anyres']['grid']}x{v['anyres']['grid']} grid); "
                        "use vision_feature_select_strategy 'default' with a [CLS] tower, 'full' without one")
    components = {
        "preprocess": Component(
            "preprocess",
            inputs=[TensorSpec("image", "uint8", ("height", "width", 3))],
            outputs=[TensorSpec("pixel_values", "float32", ("num_images", 3, *size))],
            spec=spec,
        ),
        "vision": vision,
        **language_components(model, facts["llm"]),
    }
    assets = {**tokenizer_assets(processor), NEWLINE_ASSET: _npy(model.model.image_newline)}
    return ModelIR(components, facts, assets, set(FRONTEND_PROPERTIES))


def _npy(parameter) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, parameter.detach().float().numpy(), allow_pickle=False)
    return buffer.getvalue()
