"""The image zoom-in tool: the model names a box of the row's image, the tool replies with that region,
cropped and enlarged, as an image in the conversation (DeepEyes / Mini-o3's tool; verl's `ImageZoomInTool`
semantics). Tool config `class_name`: `image_zoom_in`, or verl's `verl.tools.image_zoom_in_tool.ImageZoomInTool`.

Arguments: `bbox_2d` = [x1, y1, x2, y2], the top-left and bottom-right corners in the pixels of the image
the model sees (the row's first image after the dataset's resize); `label` (optional) names what is in it.

How a call goes:

1. the box is clamped to the image; it must then have left < right, top < bottom and sides at most 100
   times apart;
2. a box with a side under `min_side` (28 pixels) is grown around its centre until its shorter side is
   `min_side` (kept inside the image, shrunk to fit an image that is smaller), as verl does;
3. the region is cropped and resized, keeping its shape, so that its pixel count lies within
   `min_pixels` .. `max_pixels` with sides multiples of 28 (qwen-vl-utils' `smart_resize`); the agent
   loop then resizes it as the dataset resizes prompt images (`data.min_pixels` / `data.max_pixels`);
4. the reply is the image and the text `Zoomed in on the image to the region [x1, y1, x2, y2].` (with
   ` with label <label>` when given); step reward 0.0, metrics `{"success": true}`.

A missing or malformed `bbox_2d`, a box that is invalid after clamping, or a row without an image gives an
error text instead (`Error: ...`), step reward -0.05 and `{"success": false}`; the rollout goes on.

Which image: `create_kwargs["image"]` when the row's `extra_info.tools_kwargs.<tool name>.create_kwargs`
has one (a PIL image, `{"bytes": ...}` as parquet stores images, raw bytes, or a file path), else the row's
first prompt image (the agent loop hands it over: `needs_row_image`).

`config`:

| key | default | meaning |
|---|---|---|
| min_side | 28 | smallest side of a box, in pixels (smaller boxes are grown) |
| min_pixels | 3136 (4 x 28 x 28) | smallest pixel count of the returned image |
| max_pixels | 1003520 (1280 x 28 x 28) | largest pixel count of the returned image |
| num_workers, rate_limit, timeout, enable_global_rate_limit | | verl's Ray execution pool settings: accepted and unused (the crop runs in the loop's worker thread) |
"""

from __future__ import annotations

import io
import math
import uuid
from typing import Any

from verl_npu.registry import TOOLS
from verl_npu.tools.base import BaseTool, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "image_zoom_in_tool",
        "description": "Zoom in on a region of the image: crop it to a bounding box and look at it enlarged.",
        "parameters": {
            "type": "object",
            "properties": {
                "bbox_2d": {
                    "type": "array",
                    "items": {"type": "number"},
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "The region as [x1, y1, x2, y2]: top-left and bottom-right corners, "
                    "in the image's pixels.",
                },
                "label": {"type": "string", "description": "What is in the region (optional)."},
            },
            "required": ["bbox_2d"],
        },
    },
}
FAILURE_REWARD = -0.05
MAX_ASPECT = 100
#: verl's execution pool settings: no meaning here (the loop runs a plain method in a worker thread)
POOL_KEYS = ("num_workers", "rate_limit", "timeout", "enable_global_rate_limit")
KEYS = ("type", "min_side", "min_pixels", "max_pixels", "call_timeout", *POOL_KEYS)


def load_image(value: Any):
    """A PIL image (RGB) from a PIL image, parquet's `{"bytes": ..., "path": ...}`, bytes, or a file path."""
    from PIL import Image

    if hasattr(value, "convert") and hasattr(value, "size"):
        return value.convert("RGB")
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(value)).convert("RGB")
    if isinstance(value, str):
        return Image.open(value).convert("RGB")
    raise ValueError(f"cannot read an image from a {type(value).__name__}")


def fit_box(box: list[float], width: int, height: int, min_side: int) -> list[float] | None:
    """The box to crop for `box` on a `width` x `height` image (steps 1-2 of the module docstring), or None
    when it is invalid."""
    left, top = max(0.0, float(box[0])), max(0.0, float(box[1]))
    right, bottom = min(float(width), float(box[2])), min(float(height), float(box[3]))
    if not _valid(left, top, right, bottom):
        return None
    w, h = right - left, bottom - top
    if min(w, h) < min_side:
        scale = min_side / min(w, h)
        w, h = w * scale, h * scale
        shrink = min(1.0, width / w, height / h)  # an image smaller than the grown box: fit it
        w, h = w * shrink, h * shrink
        cx, cy = (left + right) / 2, (top + bottom) / 2
        left = min(max(0.0, cx - w / 2), width - w)
        top = min(max(0.0, cy - h / 2), height - h)
        left, top, right, bottom = math.floor(left), math.floor(top), math.ceil(left + w), math.ceil(top + h)
        if not _valid(left, top, right, bottom) or min(right - left, bottom - top) < min_side:
            return None
    return [left, top, right, bottom]


def _valid(left: float, top: float, right: float, bottom: float) -> bool:
    if not (left < right and top < bottom):
        return False
    w, h = right - left, bottom - top
    return max(w, h) / min(w, h) <= MAX_ASPECT


@TOOLS.register(
    "image_zoom_in",
    function_name="image_zoom_in_tool",
    verl_class_paths=("verl.tools.image_zoom_in_tool.ImageZoomInTool",),
    returns_images=True,
    doc="crops the row's image to the model's box and replies with that region",
)
class ImageZoomInTool(BaseTool):
    """Crops the row's image to the model's box and replies with it (module docstring)."""

    needs_row_image = True  # the agent loop passes the row's first image as create_kwargs["image"]

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        cfg = self.checked_config(KEYS, "the zoom-in tool")
        self.min_side = int(cfg.get("min_side", 28))
        self.min_pixels = int(cfg.get("min_pixels", 4 * 28 * 28))
        self.max_pixels = int(cfg.get("max_pixels", 1280 * 28 * 28))
        if not (self.min_side >= 1 and 0 < self.min_pixels <= self.max_pixels):
            raise ValueError(
                f"need min_side >= 1 and 0 < min_pixels <= max_pixels (got min_side={self.min_side}, "
                f"min_pixels={self.min_pixels}, max_pixels={self.max_pixels})"
            )
        self._images: dict[str, Any] = {}

    def create(self, instance_id: str | None = None, image: Any = None, **kwargs):
        create_kwargs = kwargs.get("create_kwargs") or {}
        instance_id = instance_id or str(uuid.uuid4())
        image = image if image is not None else create_kwargs.get("image")
        self._images[instance_id] = load_image(image) if image is not None else None
        return instance_id, ToolResponse()

    def execute(self, instance_id: str, parameters: Any, **kwargs):
        params = parameters if isinstance(parameters, dict) else {}
        box, label = params.get("bbox_2d"), params.get("label") or ""
        image = self._images.get(instance_id)
        if image is None:
            return self._error("there is no image to zoom into in this conversation")
        if (
            not isinstance(box, (list, tuple))
            or len(box) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)
        ):
            return self._error("bbox_2d must be a list of 4 numbers [x1, y1, x2, y2]")
        fitted = fit_box(list(box), image.width, image.height, self.min_side)
        if fitted is None:
            return self._error(
                f"the bounding box {list(box)} is invalid on this {image.width}x{image.height} image "
                f"or its crop is smaller than {self.min_side}x{self.min_side}"
            )
        crop = image.crop(tuple(fitted))
        crop = self._resize(crop)
        text = f"Zoomed in on the image to the region {list(box)}" + (f" with label {label}" if label else "") + "."
        return ToolResponse(text=text, image=[crop]), 0.0, {"success": True}

    def _resize(self, crop):
        from qwen_vl_utils.vision_process import smart_resize

        h, w = smart_resize(crop.height, crop.width, factor=28, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return crop if crop.size == (w, h) else crop.resize((w, h), resample=3)  # 3 = bicubic

    @staticmethod
    def _error(why: str):
        return ToolResponse(text=f"Error: {why}."), FAILURE_REWARD, {"success": False}

    def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    def release(self, instance_id: str, **kwargs) -> None:
        self._images.pop(instance_id, None)
