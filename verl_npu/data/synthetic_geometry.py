"""A synthetic geometry task in the Hugging Face geometry3k source format, made offline.

Each row is ``{"images": [PIL.Image], "problem": "<image>...", "answer": "3"|"4"|"5"|"6"}``:
the image (``image_size`` x ``image_size`` px, grey background) shows one filled regular
polygon (triangle, square, pentagon or hexagon) with a random size, rotation and position;
the question asks how many sides it has. The answer follows from the picture alone.

Why each polygon kind has its own fixed colour: the CPU demo trains a tiny random-init
vision tower for a few minutes. Counting corners from pixels is too hard to learn in that
budget, telling four colours apart is not, so the reward can visibly rise within minutes.
The shape is still drawn faithfully, so the picture (not the colour convention) is the
ground truth, and a model that counts sides also answers correctly.

Answers are balanced: each split holds ``n // 4`` rows of every kind (the remainder is spread
over the first kinds), in a shuffled order. A policy that ignores the image can therefore do
no better than 25% accuracy (see ``verl_npu.rewards.synthetic_geometry``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

DATA_SOURCE = "synthetic_geometry"


@dataclass(frozen=True)
class PolygonKind:
    """One kind of polygon: its name, number of sides and fixed fill colour (RGB)."""

    name: str
    sides: int
    colour: tuple[int, int, int]


POLYGON_KINDS: tuple[PolygonKind, ...] = (
    PolygonKind("triangle", 3, (255, 0, 0)),  # red
    PolygonKind("square", 4, (0, 0, 255)),  # blue
    PolygonKind("pentagon", 5, (0, 255, 0)),  # green
    PolygonKind("hexagon", 6, (255, 255, 0)),  # yellow
)

#: the background: mid-grey, so each kind's colour differs from it in its own direction
BACKGROUND = (128, 128, 128)

#: what the pictures are, recorded in the parquet files (`geometry3k.SYNTHETIC_MARK`); change it
#: whenever the pictures or questions change, so that data made before is recognised as old
GENERATOR = "synthetic_geometry v2 (pure-colour polygons on grey)"

QUESTION_TEMPLATES: tuple[str, ...] = (
    "<image>How many sides does the polygon in the picture have?",
    "<image>The figure shows a regular polygon. How many sides does it have?",
    "<image>Count the sides of the shaded shape. How many are there?",
)


def polygon_vertices(
    sides: int, centre: tuple[float, float], radius: float, rotation: float
) -> list[tuple[float, float]]:
    """Vertices of a regular polygon: ``centre + radius * (cos, sin)(rotation + 2*pi*k/sides)``."""
    cx, cy = centre
    return [
        (
            cx + radius * math.cos(rotation + 2 * math.pi * k / sides),
            cy + radius * math.sin(rotation + 2 * math.pi * k / sides),
        )
        for k in range(sides)
    ]


def draw_polygon(kind: PolygonKind, rng: np.random.Generator, image_size: int) -> Image.Image:
    """Render ``kind`` filled in its colour on a grey (``BACKGROUND``) RGB square of side ``image_size``.

    Radius is 35-47% of the side, rotation uniform in [0, 2*pi), and the centre is jittered
    by up to (0.5 * side - radius - 1) px so the polygon always stays inside the image.
    """
    if image_size < 16:
        raise ValueError(f"image_size must be >= 16 px to draw a polygon, got {image_size}")
    radius = float(rng.uniform(0.35, 0.47)) * image_size
    slack = max(0.0, image_size / 2 - radius - 1)
    centre = (image_size / 2 + float(rng.uniform(-slack, slack)), image_size / 2 + float(rng.uniform(-slack, slack)))
    rotation = float(rng.uniform(0, 2 * math.pi))
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    ImageDraw.Draw(image).polygon(
        polygon_vertices(kind.sides, centre, radius, rotation), fill=kind.colour, outline=(0, 0, 0)
    )
    return image


def balanced_kinds(n: int, rng: np.random.Generator) -> list[PolygonKind]:
    """``n`` polygon kinds, each kind ``n // 4`` times (+1 for the first ``n % 4``), shuffled."""
    kinds = [POLYGON_KINDS[i % len(POLYGON_KINDS)] for i in range(n)]
    order = rng.permutation(n)
    return [kinds[i] for i in order]


def generate_rows(n: int, seed: int, image_size: int = 56, split: str = "train") -> list[dict]:
    """``n`` source rows (``images``, ``problem``, ``answer``), a pure function of its arguments.

    The random stream is seeded with ``(seed, split)`` so train and test rows of the same seed
    differ.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    split_code = sum(ord(c) for c in split)  # stable across processes, unlike hash()
    rng = np.random.default_rng([seed, split_code])
    rows = []
    for kind in balanced_kinds(n, rng):
        template = QUESTION_TEMPLATES[int(rng.integers(len(QUESTION_TEMPLATES)))]
        rows.append({"images": [draw_polygon(kind, rng, image_size)], "problem": template, "answer": str(kind.sides)})
    return rows
