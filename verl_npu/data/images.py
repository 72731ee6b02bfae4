"""How a picture is resized before the processor sees it, for prompts (the dataset) and for the images a
tool returns into a conversation (the agent loop): qwen-vl-utils' ``smart_resize``, both sides multiples
of patch x merge and the pixel count within min_pixels .. max_pixels (the data settings, else the image
processor's own), in RGB, bicubic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageResizer:
    factor: int  # patch_size x merge_size of the image processor
    min_pixels: int | None
    max_pixels: int | None

    @classmethod
    def of(cls, image_processor, min_pixels: int | None = None, max_pixels: int | None = None) -> ImageResizer:
        """The image processor's factor and pixel limits; `min_pixels` / `max_pixels` (data settings) win."""
        merge = int(getattr(image_processor, "merge_size", 2))
        size = getattr(image_processor, "size", None) or {}
        return cls(
            int(getattr(image_processor, "patch_size", 14)) * merge,
            min_pixels or getattr(image_processor, "min_pixels", None) or size.get("shortest_edge"),
            max_pixels or getattr(image_processor, "max_pixels", None) or size.get("longest_edge"),
        )

    def size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) after smart_resize."""
        from qwen_vl_utils.vision_process import smart_resize  # noqa: PLC0415

        return smart_resize(height, width, factor=self.factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def __call__(self, image):
        """`image` (PIL) in RGB at `size`."""
        from qwen_vl_utils.vision_process import to_rgb  # noqa: PLC0415

        h, w = self.size(image.height, image.width)
        image = to_rgb(image)
        return image if image.size == (w, h) else image.resize((w, h), resample=3)  # 3 = bicubic
