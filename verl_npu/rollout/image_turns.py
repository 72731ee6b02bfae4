"""Images in multi-turn conversations (the `hf` engine's agent loop, Qwen2/2.5-VL style processors).

A trajectory's images are its prompt's (the dataset's `multi_modal_data` / `multi_modal_inputs`) followed by
every image a tool returned (`ToolResponse(image=[PIL...])`), in the order their placeholder tokens appear in
the sequence. `ImageTurns` prepares a tool's images exactly as the dataset prepares a prompt's:

- each image is converted to RGB and resized with qwen-vl-utils' `smart_resize` (sides multiples of
  patch x merge, pixel count within `data.min_pixels` .. `data.max_pixels`, else the image processor's);
- the tool turn's text (rendered by the chat template, one `<|image_pad|>` per image part) goes through the
  processor with those images (`do_resize=False`), which expands each placeholder into the image's
  vision tokens and returns `pixel_values` / `image_grid_thw`.

So a trajectory's `multi_modal_inputs` (the processor tensors of all its images, concatenated) match its
vision tokens one for one, and every forward over the trajectory (the rollout's next turns, old / ref
log-probs, the update) sees all of them, with the model's 3-D rope positions computed over the whole
sequence (`verl_npu.models.forward.rope_positions`).
"""

from __future__ import annotations

import re

from verl_npu.data.images import ImageResizer
from verl_npu.errors import UserError

#: processor outputs that are per token, not per image: they stay out of `multi_modal_inputs`
SEQUENCE_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


def short_text(text: str, image_token: str) -> str:
    """`text` with each run of image placeholder tokens written once, with its count (readable dumps)."""
    token = re.escape(image_token)
    return re.sub(f"(?:{token})+", lambda m: f"{image_token}x{len(m.group(0)) // len(image_token)}", text)


class ImageTurns:
    """Prepares the images of tool turns (see the module docstring) with `processor`; `min_pixels` /
    `max_pixels`: `data.min_pixels` / `data.max_pixels` (None: the image processor's own)."""

    def __init__(self, processor, min_pixels: int | None = None, max_pixels: int | None = None):
        ip = getattr(processor, "image_processor", None)
        self.image_token = getattr(processor, "image_token", None)
        if ip is None or self.image_token is None:
            raise UserError(
                f"the processor {type(processor).__name__} has no image processor / image token, so "
                "images cannot join a multi-turn conversation; use a vision-language model (Qwen2.5-VL)"
            )
        self.processor = processor
        tok = getattr(processor, "tokenizer", processor)
        self.image_token_id = tok.convert_tokens_to_ids(self.image_token)
        #: `image` (PIL) in RGB, resized as the dataset resizes prompt images
        self.resize = ImageResizer.of(ip, min_pixels, max_pixels)
        self.factor = self.resize.factor

    def encode(self, text: str, images: list) -> tuple[list[int], dict]:
        """(token ids, processor tensors) of a turn's `text` holding one image placeholder per image of
        `images` (already `resize`d), each placeholder expanded into its image's vision tokens."""
        out = self.processor(text=[text], images=images, return_tensors="pt", do_resize=False)
        ids = out["input_ids"][0]
        grid = out.get("image_grid_thw")
        merge = self.factor // int(getattr(self.processor.image_processor, "patch_size", 14))
        want = int(grid.prod(-1).sum()) // (merge * merge) if grid is not None else 0
        found = int((ids == self.image_token_id).sum())
        if found != want or grid is None or len(grid) != len(images):
            raise UserError(
                f"a tool turn with {len(images)} image(s) rendered {found} image tokens where its images "
                f"need {want}: the chat template must write one image placeholder per image part of a "
                "tool message (actor_rollout_ref.model.custom_chat_template)"
            )
        return ids.tolist(), {k: v for k, v in out.items() if k not in SEQUENCE_KEYS}
