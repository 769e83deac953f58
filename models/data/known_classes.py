"""Class names of the four datasets the seeds' papers report on, in the order of their label matrices."""

from __future__ import annotations

__all__ = ["COCO_CLASSES", "CUB_ATTRIBUTES", "NUS_WIDE_CONCEPTS"]

COCO_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear",
    "hair drier", "toothbrush",
)  # fmt: skip

NUS_WIDE_CONCEPTS: tuple[str, ...] = (
    "airport", "animal", "beach", "bear", "birds", "boats", "book", "bridge", "buildings", "cars", "castle",
    "cat", "cityscape", "clouds", "computer", "coral", "cow", "dancing", "dog", "earthquake", "elk", "fire",
    "fish", "flags", "flowers", "food", "fox", "frost", "garden", "glacier", "grass", "harbor", "horses",
    "house", "lake", "leaf", "map", "military", "moon", "mountain", "nighttime", "ocean", "person", "plane",
    "plants", "police", "protest", "railroad", "rainbow", "reflection", "road", "rocks", "running", "sand",
    "sign", "sky", "snow", "soccer", "sports", "statue", "street", "sun", "sunset", "surf", "swimmers", "tattoo",
    "temple", "tiger", "tower", "town", "toy", "train", "tree", "valley", "vehicle", "water", "waterfall",
    "wedding", "whales", "window", "zebra",
)  # fmt: skip

# attributes.txt lists 28 attribute groups ("has_<part>::<value>"); the colour groups share these 15 values
# (has_eye_color lacks "iridescent").
_COLOURS = ("blue", "brown", "iridescent", "purple", "rufous", "grey", "yellow", "olive", "green", "pink", "orange",
            "black", "white", "red", "buff")
_PATTERNS = ("solid", "spotted", "striped", "multi-colored")
_CUB_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("has_bill_shape", ("curved_(up_or_down)", "dagger", "hooked", "needle", "hooked_seabird", "spatulate",
                        "all-purpose", "cone", "specialized")),
    ("has_wing_color", _COLOURS),
    ("has_upperparts_color", _COLOURS),
    ("has_underparts_color", _COLOURS),
    ("has_breast_pattern", _PATTERNS),
    ("has_back_color", _COLOURS),
    ("has_tail_shape", ("forked_tail", "rounded_tail", "notched_tail", "fan-shaped_tail", "pointed_tail",
                        "squared_tail")),
    ("has_upper_tail_color", _COLOURS),
    ("has_head_pattern", ("spotted", "malar", "crested", "masked", "unique_pattern", "eyebrow", "eyering", "plain",
                          "eyeline", "striped", "capped")),
    ("has_breast_color", _COLOURS),
    ("has_throat_color", _COLOURS),
    ("has_eye_color", tuple(c for c in _COLOURS if c != "iridescent")),
    ("has_bill_length", ("about_the_same_as_head", "longer_than_head", "shorter_than_head")),
    ("has_forehead_color", _COLOURS),
    ("has_under_tail_color", _COLOURS),
    ("has_nape_color", _COLOURS),
    ("has_belly_color", _COLOURS),
    ("has_wing_shape", ("rounded-wings", "pointed-wings", "broad-wings", "tapered-wings", "long-wings")),
    ("has_size", ("large_(16_-_32_in)", "small_(5_-_9_in)", "very_large_(32_-_72_in)", "medium_(9_-_16_in)",
                  "very_small_(3_-_5_in)")),
    ("has_shape", ("upright-perching_water-like", "chicken-like-marsh", "long-legged-like", "duck-like", "owl-like",
                   "gull-like", "hummingbird-like", "pigeon-like", "tree-clinging-like", "hawk-like",
                   "sandpiper-like", "upland-ground-like", "swallow-like", "perching-like")),
    ("has_back_pattern", _PATTERNS),
    ("has_tail_pattern", _PATTERNS),
    ("has_belly_pattern", _PATTERNS),
    ("has_primary_color", _COLOURS),
    ("has_leg_color", _COLOURS),
    ("has_bill_color", _COLOURS),
    ("has_crown_color", _COLOURS),
    ("has_wing_pattern", _PATTERNS))
CUB_ATTRIBUTES: tuple[str, ...] = tuple(f"{group}::{value}" for group, values in _CUB_GROUPS for value in values)
